package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

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
