package webhook_test

import (
	"io"
	"net/http"
	"os"

	"github.com/composer-dev/composer/sdk/webhook"
)

// A receiver checks every request before trusting it.
func ExampleVerify() {
	http.HandleFunc("/hooks/composer", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		if err := webhook.Verify(os.Getenv("COMPOSER_WEBHOOK_SECRET"), r.Header, body); err != nil {
			http.Error(w, "invalid signature", http.StatusUnauthorized)
			return
		}
		// Deduplicate on r.Header.Get("webhook-id"): retries carry the same one.
		w.WriteHeader(http.StatusNoContent)
	})
}
