package plaintext

import "unicode"

// Disguising reports the characters that can drive a terminal or disguise
// text where it is shown: the control characters (C0, DEL and C1, among
// them ESC, CR and LF), the bidirectional formatting characters (U+202E
// shows "order-1\u202Egnp.exe" as "order-1exe.png") and the line and
// paragraph separators U+2028 and U+2029, which some viewers break lines at.
func Disguising(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) || r == '\u2028' || r == '\u2029'
}
