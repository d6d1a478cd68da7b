package worker_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/composer-dev/composer/sdk/worker"
)

// A worker with a typed handler: a task node {"type": "task", "task":
// {"handler": "charge"}} runs it. Run blocks until SIGINT/SIGTERM, then
// drains.
func Example() {
	w, err := worker.New(os.Getenv("COMPOSER_URL"), os.Getenv("COMPOSER_API_KEY"), worker.Options{Concurrency: 8})
	if err != nil {
		log.Fatal(err)
	}
	type charge struct {
		Customer string `json:"customer"`
		Cents    int    `json:"cents"`
	}
	worker.Handle(w, "charge", func(ctx context.Context, in charge) (map[string]string, error) {
		t, _ := worker.TaskFrom(ctx)
		// t.ID is stable across retries: the idempotency key for the payment provider.
		return map[string]string{"charge_id": "ch_" + t.ID.String()}, nil
	})
	if err := w.Run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// Errors say whether another attempt can help.
func ExamplePermanent() {
	validate := func(cents int) error {
		if cents <= 0 {
			// Retrying cannot fix bad input: fail the node now.
			return worker.Permanent(fmt.Errorf("amount must be positive, got %d", cents))
		}
		return nil
	}
	fmt.Println(validate(-5))
	// Output: permanent_error: amount must be positive, got -5
}

// A partner asked to be called again later: the node is retried no sooner.
func ExampleRetryAfter() {
	err := worker.RetryAfter(fmt.Errorf("partner rate limit"), 30*time.Second)
	fmt.Println(err)
	// Output: task_error: partner rate limit
}
