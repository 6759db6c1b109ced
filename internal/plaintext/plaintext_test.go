package plaintext

import "testing"

func TestDisguising(t *testing.T) {
	for _, r := range []rune{0, '\t', '\n', '\r', 0x1b, 0x7f, 0x85, 0x9b, 0x061c, 0x200e, 0x200f, 0x202a, 0x202e, 0x2066, 0x2069, 0x2028, 0x2029} {
		if !Disguising(r) {
			t.Errorf("%U is not disguising", r)
		}
	}
	for _, r := range []rune{' ', 'a', 'é', '✓', '𝄞', 0x00a0, 0x3000} {
		if Disguising(r) {
			t.Errorf("%U is disguising", r)
		}
	}
}
