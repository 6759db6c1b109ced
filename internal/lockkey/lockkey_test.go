package lockkey

import "testing"

func TestPairKnownValue(t *testing.T) {
	t.Parallel()
	a1, a2 := Pair("annals:append")
	b1, b2 := Pair("annals:append")
	if a1 != b1 || a2 != b2 {
		t.Fatalf("Pair is not deterministic: (%d,%d) vs (%d,%d)", a1, a2, b1, b2)
	}
	c1, c2 := Pair("annals:appenD")
	if a1 == c1 && a2 == c2 {
		t.Fatalf("different strings gave the same key (%d,%d)", a1, a2)
	}
}

func TestPairMatchesMD5Halves(t *testing.T) {
	t.Parallel()
	// md5("") = d41d8cd98f00b204e9800998ecf8427e
	k1, k2 := Pair("")
	if uint32(k1) != 0xd41d8cd9 || uint32(k2) != 0x8f00b204 {
		t.Fatalf("Pair(\"\") = (%#x,%#x), want (0xd41d8cd9,0x8f00b204)", uint32(k1), uint32(k2))
	}
}
