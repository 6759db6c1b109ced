// annals console: the little JavaScript it has. Everything works without it
// except the live follow; with it, dangerous forms ask for confirmation.
(function () {
  "use strict";
  // Confirmation of forms (and buttons) marked data-confirm.
  document.addEventListener("submit", function (ev) {
    var btn = ev.submitter;
    var msg = (btn && btn.dataset.confirm) || ev.target.dataset.confirm;
    if (msg && !window.confirm(msg)) ev.preventDefault();
  });
  var all = document.getElementById("select-all");
  if (all) all.addEventListener("change", function () {
    document.querySelectorAll("input.dl-select").forEach(function (b) { b.checked = all.checked; });
  });
  // Live follow of the log with server-sent events.
  var follow = document.getElementById("follow");
  if (!follow) return;
  var source = null;
  var state = document.getElementById("follow-state");
  var base = document.body.dataset.base || "";
  function cell(tr, text, href) {
    var td = document.createElement("td");
    if (href) { var a = document.createElement("a"); a.href = href; a.textContent = text; td.appendChild(a); }
    else td.textContent = text;
    tr.appendChild(td);
    return td;
  }
  follow.addEventListener("click", function () {
    if (source) { source.close(); source = null; follow.textContent = "Follow live"; state.textContent = ""; return; }
    var tbody = document.querySelector("#log-events tbody");
    source = new EventSource(follow.dataset.follow);
    follow.textContent = "Stop";
    state.textContent = "following…";
    source.addEventListener("append", function (m) {
      var e = JSON.parse(m.data);
      var tr = document.createElement("tr");
      tr.className = "new";
      cell(tr, String(e.position), base + "/events/" + e.position).firstChild.className = "event-link";
      cell(tr, e.stream, base + "/streams/" + encodeURIComponent(e.stream));
      cell(tr, String(e.version));
      cell(tr, e.type);
      cell(tr, e.recorded_at.replace("T", " ").replace(/\.\d+Z$/, "Z"));
      var code = document.createElement("code");
      code.textContent = e.data.length > 120 ? e.data.slice(0, 120) + "…" : e.data;
      cell(tr, "").appendChild(code);
      tbody.appendChild(tr);
      state.textContent = "following… last position " + e.position;
    });
    source.onerror = function () { state.textContent = "reconnecting…"; };
  });
})();
