package cutover

import (
	"fmt"
	"os"
	"testing"
	"time"
)

// TestMain runs the tests, or, started by a test with KUBEFENCE_TEST_BAKING_HOLDER set, is a
// baking cutover's process: it holds that state dir's lock marked as baking until killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("KUBEFENCE_TEST_BAKING_HOLDER"); dir != "" {
		holdAsBaking(dir)
		return
	}
	os.Exit(m.Run())
}

func holdAsBaking(dir string) {
	lock, err := lockStateDir(dir)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	lock.markBaking()
	fmt.Println("holding")
	time.Sleep(time.Minute)
	os.Exit(0)
}
