package errs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestKindsSurviveWrapping(t *testing.T) {
	base := E(NotFound, "run %s not found", "r1")
	wrapped := fmt.Errorf("load: %w", base)
	assert.True(t, errors.Is(wrapped, NotFound))
	assert.False(t, errors.Is(wrapped, Forbidden))
	assert.Equal(t, NotFound, KindOf(wrapped))
	assert.Equal(t, "run r1 not found", PublicMessage(wrapped))
}

func TestCausesAreNotShown(t *testing.T) {
	err := Wrap(Internal, errors.New("pq: password authentication failed for user x"), "could not start run")
	assert.Equal(t, "internal error", PublicMessage(err))
	assert.Equal(t, Internal, KindOf(errors.New("plain")))
	assert.Equal(t, "internal error", PublicMessage(errors.New("secret detail")))
	shown := Wrap(Conflict, errors.New("unique_violation on idx"), "key already used")
	assert.Equal(t, "key already used", PublicMessage(shown))
}
