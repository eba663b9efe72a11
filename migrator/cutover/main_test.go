package cutover

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the tests, or, started by a test with KUBEFENCE_TEST_BAKING_HOLDER set, is a
// baking cutover's process: it holds that state dir's lock marked as baking until killed. With
// KUBEFENCE_TEST_SLOW_STOP set it takes SIGTERM as a bake does, says "stopping", and stops only
// when killed (a bake whose stop takes its time).
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
	if os.Getenv("KUBEFENCE_TEST_SLOW_STOP") != "" {
		term := make(chan os.Signal, 1)
		signal.Notify(term, syscall.SIGTERM)
		fmt.Println("holding")
		<-term
		fmt.Println("stopping")
	} else {
		fmt.Println("holding")
	}
	time.Sleep(time.Minute)
	os.Exit(0)
}
