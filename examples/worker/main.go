// Command worker runs your own code as steps of Composer workflows. It
// needs the server's URL and an API key of the worker scope, nothing else:
//
//	COMPOSER_URL=http://127.0.0.1:8080 COMPOSER_API_KEY=cmp_… go run ./examples/worker
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/composer-dev/composer/sdk/worker"
)

type Order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

type Receipt struct {
	Order   string `json:"order"`
	Charged int    `json:"charged"`
	Key     string `json:"idempotency_key"`
}

func main() {
	w, err := worker.New(os.Getenv("COMPOSER_URL"), os.Getenv("COMPOSER_API_KEY"), worker.Options{})
	if err != nil {
		log.Fatal(err)
	}
	// A task node {"type": "task", "task": {"handler": "charge"}} runs this.
	worker.Handle(w, "charge", func(ctx context.Context, o Order) (Receipt, error) {
		if o.Amount <= 0 {
			return Receipt{}, worker.Permanent(fmt.Errorf("amount must be positive, got %d", o.Amount))
		}
		t, _ := worker.TaskFrom(ctx) // t.ID is the same on every retry: the idempotency key to pass on
		return Receipt{Order: o.ID, Charged: o.Amount, Key: t.ID.String()}, nil
	})
	if err := w.Run(context.Background()); err != nil { // until SIGINT or SIGTERM
		log.Fatal(err)
	}
}
