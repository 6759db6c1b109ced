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
  // Stored text is shown as the server renders it (the template function
  // vis): every character that can disguise text or drive a terminal
  // (package plaintext's Disguising: the control characters, the
  // bidirectional formatting characters, U+2028 and U+2029) written as
  // \uXXXX. console_test.go holds this class to Disguising.
  var disguising = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2028\u2029\u2066-\u2069]/g;
  function vis(s) {
    return s.replace(disguising, function (c) { return "\\u" + ("000" + c.charCodeAt(0).toString(16)).slice(-4); });
  }
  // A path segment: encodeURIComponent leaves the dots of "." and "..",
  // which a browser resolves as the directory or its parent.
  function seg(s) {
    var e = encodeURIComponent(s);
    return e === "." ? "%2E" : e === ".." ? "%2E%2E" : e;
  }
  // Live follow of the log with server-sent events.
  var follow = document.getElementById("follow");
  if (!follow) return;
  var source = null;
  var state = document.getElementById("follow-state");
  var base = document.body.dataset.base || "";
  // The rows the followed table keeps: the oldest go first.
  var keep = parseInt(follow.dataset.keep, 10) || 500;
  var last = "";
  function show(text, failing) {
    state.textContent = text;
    state.classList.toggle("failing", !!failing);
  }
  function cell(tr, text, href) {
    var td = document.createElement("td");
    if (href) { var a = document.createElement("a"); a.href = href; a.textContent = text; td.appendChild(a); }
    else td.textContent = text;
    tr.appendChild(td);
    return td;
  }
  follow.addEventListener("click", function () {
    if (source) { source.close(); source = null; follow.textContent = "Follow live"; show(""); return; }
    var tbody = document.querySelector("#log-events tbody");
    source = new EventSource(follow.dataset.follow);
    follow.textContent = "Stop";
    show("following…");
    source.addEventListener("append", function (m) {
      var e = JSON.parse(m.data);
      var tr = document.createElement("tr");
      tr.className = "new";
      cell(tr, String(e.position), base + "/events/" + e.position).firstChild.className = "event-link";
      cell(tr, vis(e.stream), base + "/streams/" + seg(e.stream));
      cell(tr, String(e.version));
      cell(tr, vis(e.type));
      cell(tr, e.recorded_at.replace("T", " ").replace(/\.\d+Z$/, "Z"));
      var code = document.createElement("code");
      code.textContent = vis(e.data.length > 120 ? e.data.slice(0, 120) + "…" : e.data);
      cell(tr, "").appendChild(code);
      tbody.appendChild(tr);
      while (tbody.rows.length > keep) tbody.deleteRow(0);
      last = " last position " + e.position;
      show("following…" + last);
    });
    // The server could not read the log (the database is down): it keeps
    // trying, and says "recovered" once it reads again.
    source.addEventListener("failure", function (m) {
      var msg = "";
      try { msg = JSON.parse(m.data); } catch (err) { msg = m.data; }
      show("the log cannot be read, retrying: " + vis(String(msg)), true);
    });
    source.addEventListener("recovered", function () { show("following…" + last); });
    source.onopen = function () { show("following…" + last); };
    source.onerror = function () { show("connection lost, reconnecting…", true); };
  });
})();
