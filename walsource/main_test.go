package walsource_test

import (
	"testing"

	"github.com/annals-dev/annals/annalstest"
)

func TestMain(m *testing.M) { annalstest.Main(m) }
