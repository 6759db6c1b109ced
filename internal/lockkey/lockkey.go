package lockkey

import (
	"crypto/md5"
	"encoding/binary"
)

// Pair returns the two int4 halves of md5(s) used as an advisory-lock key.
func Pair(s string) (k1, k2 int32) {
	sum := md5.Sum([]byte(s))
	return int32(binary.BigEndian.Uint32(sum[0:4])), int32(binary.BigEndian.Uint32(sum[4:8]))
}
