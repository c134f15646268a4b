package etcdtest

import (
	"testing"

	"github.com/prefixrouter/prefixrouter/internal/testsupport"
)

func TestMain(m *testing.M) { testsupport.VerifyNoLeaks(m) }
