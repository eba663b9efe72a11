package framework

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

// UntilInterrupted runs run with a context that Ctrl-C, SIGTERM or SIGHUP cancels, so that a bench
// stops every process it started and removes its temporary directories (gigabytes for large
// sizes) before it exits; a second signal ends the program at once. An error of a run a signal
// ended is reported as an interruption; any other error is returned as it is.
func UntilInterrupted(run func(context.Context) error) error {
	// SIGHUP: its terminal closed.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() { <-ctx.Done(); stop() }() // the second signal takes the default action
	err := run(ctx)
	interrupted := ctx.Err() != nil // before stop, which cancels ctx too
	stop()
	if err != nil && interrupted {
		return errors.New("interrupted; what the run started is stopped and its directories removed")
	}
	return err
}
