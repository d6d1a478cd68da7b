package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/composer-dev/composer/sdk/client"
)

// Start a run idempotently from a tenant's backend and wait for its result.
func Example() {
	c, err := client.New(os.Getenv("COMPOSER_URL"), os.Getenv("COMPOSER_API_KEY"))
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	order := map[string]any{"order": "o-42", "amount": 1999}
	run, created, err := c.StartRun(ctx, client.Start{Workflow: "order", Input: order, IdempotencyKey: "o-42"})
	switch {
	case client.ErrorCode(err) == "RATE_LIMITED":
		log.Fatal("slow down and retry")
	case err != nil:
		log.Fatal(err)
	}
	fmt.Println("created:", created)
	run, err = c.WaitRun(ctx, run.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(run.Status, string(run.Output))
}
