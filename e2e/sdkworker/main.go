// Command sdkworker is a tenant's worker for the end-to-end tests: built
// as its own binary on the SDK and started with only COMPOSER_URL and
// COMPOSER_API_KEY (plus COMPOSER_LEASE_TTL, a test speed-up), it reaches
// Composer through the public API alone.
//
// Handler "slow" sleeps for its input's sleep_ms on its first attempt
// (ignoring cancellation, like a process that is frozen or busy) and
// answers at once on later attempts; its output names the worker and the
// attempt that produced it.
package main

import (
	"context"
	"log"
	"log/slog"
	"os"
	"time"

	"github.com/composer-dev/composer/sdk/worker"
)

func main() {
	ttl, _ := time.ParseDuration(os.Getenv("COMPOSER_LEASE_TTL"))
	w, err := worker.New(os.Getenv("COMPOSER_URL"), os.Getenv("COMPOSER_API_KEY"), worker.Options{LeaseTTL: ttl,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		log.Fatal(err)
	}
	worker.Handle(w, "slow", func(ctx context.Context, in struct {
		SleepMS int `json:"sleep_ms"`
	}) (map[string]any, error) {
		t, _ := worker.TaskFrom(ctx)
		if t.Attempt == 1 {
			time.Sleep(time.Duration(in.SleepMS) * time.Millisecond)
		}
		return map[string]any{"worker": w.ID(), "attempt": t.Attempt}, nil
	})
	if err := w.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}
