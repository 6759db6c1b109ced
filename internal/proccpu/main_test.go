package proccpu

import (
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestMain(m *testing.M) { annalstest.Main(m) }
