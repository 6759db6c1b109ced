package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/spf13/cobra"
)

// Output formats of --output. Not every command offers all three: a list
// offers json (one array) and jsonl (one object per line), a single object
// json only, an endless stream (tail --follow) jsonl only.
const (
	outputText  = "text"
	outputJSON  = "json"
	outputJSONL = "jsonl"
)

// outputValue is the value of --output: one of allowed, checked when the
// flag is parsed so that a bad value is a flag error (exit 2) naming the
// allowed values.
type outputValue struct {
	value   *string
	allowed []string
	// legacy maps the old --format spellings (table) to --output values.
	legacy bool
	// given is what this flag was given (as spelled), other what the other
	// flag of the pair (--output, --format) was given: "" when not given.
	// Both given and meaning different formats is a flag error.
	given, other *string
}

// canonicalOutput maps the old --format spelling table to text.
func canonicalOutput(s string) string {
	if s == "table" {
		return outputText
	}
	return s
}

func (o *outputValue) String() string { return *o.value }
func (o *outputValue) Type() string   { return "format" }

func (o *outputValue) Set(spelled string) error {
	s := spelled
	if o.legacy {
		s = canonicalOutput(s)
	}
	if !slices.Contains(o.allowed, s) {
		return errors.Newf("want %s", orList(o.allowed))
	}
	if o.other != nil && *o.other != "" && canonicalOutput(*o.other) != s {
		flag := "--output"
		if !o.legacy {
			flag = "--format"
		}
		return errors.Newf("%s %s says otherwise (--format is the old name of --output: give one of them)", flag, *o.other)
	}
	if o.given != nil {
		*o.given = spelled
	}
	*o.value = s
	return nil
}

// orList is "a or b", "a, b or c".
func orList(s []string) string {
	if len(s) == 1 {
		return s[0]
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// addOutputFlag gives cmd the --output flag with the allowed formats (text
// first, the default) and, when legacyFormat, the old --format flag as a
// hidden, deprecated alias that writes the same value (table means text).
// Both given with different values is a usage error.
func addOutputFlag(cmd *cobra.Command, legacyFormat bool, allowed ...string) *string {
	out := outputText
	var output, format string
	cmd.Flags().Var(&outputValue{value: &out, allowed: allowed, given: &output, other: &format}, "output", orList(allowed))
	if legacyFormat {
		cmd.Flags().Var(&outputValue{value: &out, allowed: allowed, legacy: true, given: &format, other: &output}, "format", "deprecated: use --output")
		_ = cmd.Flags().MarkHidden("format")
	}
	return &out
}

// writeJSON writes v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return errors.Wrap(err, "encode JSON")
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeJSONList writes items as a JSON array (format json, one element a
// line) or as JSON lines (format jsonl).
func writeJSONList[T any](w io.Writer, format string, items []T) error {
	if format == outputJSON {
		if len(items) == 0 {
			_, err := io.WriteString(w, "[]\n")
			return err
		}
	}
	for i, it := range items {
		b, err := json.Marshal(it)
		if err != nil {
			return errors.Wrap(err, "encode JSON")
		}
		if format == outputJSON {
			sep := ",\n"
			if i == 0 {
				sep = "[\n"
			}
			io.WriteString(w, sep)
		}
		if _, err := w.Write(b); err != nil {
			return err
		}
		if format == outputJSONL {
			io.WriteString(w, "\n")
		}
	}
	if format == outputJSON {
		_, err := io.WriteString(w, "\n]\n")
		return err
	}
	return nil
}

// displayWidth is how many terminal columns s takes, as terminals commonly
// show it: control, format and zero-width characters and combining marks
// none, East Asian wide and fullwidth characters and pictographs two, any
// other character one (and a byte that is not UTF-8 one). Text cells are
// padded and cut by it, not by bytes (which split characters) or runes
// (which undercount CJK and overcount accents written as combining marks).
func displayWidth(s string) int {
	n := 0
	for _, r := range s {
		n += runeWidth(r)
	}
	return n
}

// wideRanges are the code points displayWidth counts as two columns:
// Unicode's East Asian Wide and Fullwidth blocks and the pictograph blocks
// terminals draw wide.
var wideRanges = [...][2]rune{
	{0x1100, 0x115F},   // Hangul Jamo initial consonants
	{0x2E80, 0x303E},   // CJK radicals, Kangxi, CJK symbols and punctuation
	{0x3041, 0x33FF},   // Hiragana, Katakana, Bopomofo, Hangul compatibility, CJK strokes, enclosed, compatibility
	{0x3400, 0x4DBF},   // CJK extension A
	{0x4E00, 0x9FFF},   // CJK unified ideographs
	{0xA000, 0xA4CF},   // Yi
	{0xA960, 0xA97F},   // Hangul Jamo extended A
	{0xAC00, 0xD7A3},   // Hangul syllables
	{0xF900, 0xFAFF},   // CJK compatibility ideographs
	{0xFE10, 0xFE19},   // vertical forms
	{0xFE30, 0xFE6F},   // CJK compatibility and small forms
	{0xFF00, 0xFF60},   // fullwidth forms
	{0xFFE0, 0xFFE6},   // fullwidth signs
	{0x1F300, 0x1F64F}, // pictographs, emoticons
	{0x1F900, 0x1F9FF}, // supplemental pictographs
	{0x20000, 0x3FFFD}, // CJK extensions B and later
}

func runeWidth(r rune) int {
	switch {
	case r < 0x20 || (r >= 0x7F && r < 0xA0):
		return 0
	case r < 0x300:
		return 1
	case unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf):
		return 0
	}
	for _, w := range wideRanges {
		if r < w[0] {
			break
		}
		if r <= w[1] {
			return 2
		}
	}
	return 1
}

// truncateWidth cuts s to at most width columns (displayWidth), ending it
// with ellipsis when it cuts; it cuts only between characters, keeping the
// combining marks of the last character it keeps.
func truncateWidth(s string, width int, ellipsis string) string {
	if displayWidth(s) <= width {
		return s
	}
	budget := width - displayWidth(ellipsis)
	n, end := 0, 0
	for end < len(s) {
		r, size := utf8.DecodeRuneInString(s[end:]) // a byte that is not UTF-8: size 1, width 1
		w := runeWidth(r)
		if n+w > budget {
			break
		}
		n += w
		end += size
	}
	return s[:end] + ellipsis
}

// textCell is s as one cell of a text table: tabs and line breaks, which
// would start another cell or row, become spaces.
func textCell(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '\t', '\n', '\r', '\v', '\f':
			return ' '
		}
		return r
	}, s)
}

// textTable lines rows of cells up in columns two spaces apart, by display
// width (text/tabwriter counts runes, so a CJK value pushed the columns
// after it out of line). The last cell of a row is not padded. It holds
// every row until write, as a tabwriter does until Flush.
type textTable struct {
	rows [][]string
}

func (t *textTable) add(cells ...string) { t.rows = append(t.rows, cells) }

// write writes the rows held and forgets them.
func (t *textTable) write(w io.Writer) error {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r[:len(r)-1] {
			if i == len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], displayWidth(c))
		}
	}
	var b strings.Builder
	for _, r := range t.rows {
		for i, c := range r {
			b.WriteString(c)
			if i < len(r)-1 {
				b.WriteString(strings.Repeat(" ", widths[i]-displayWidth(c)+2))
			}
		}
		b.WriteByte('\n')
	}
	t.rows = nil
	_, err := io.WriteString(w, b.String())
	return err
}
