package app_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/composer-dev/composer/audit"
	"github.com/composer-dev/composer/internal/app"
	"github.com/composer-dev/composer/internal/config"
)

// TestTheAuditKeyIsRequiredOutsideDevelopment: without COMPOSER_AUDIT_KEY
// a production configuration is refused with what to do, development
// falls back to the public development key, and a malformed key is
// refused naming the variable without echoing it.
func TestTheAuditKeyIsRequiredOutsideDevelopment(t *testing.T) {
	t.Parallel()
	cfg := config.Defaults()
	_, err := app.AuditKeyring(&app.Deps{Cfg: cfg})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "COMPOSER_AUDIT_KEY is not set")
	assert.Contains(t, err.Error(), "openssl rand -base64 32")

	cfg.Dev = true
	k, err := app.AuditKeyring(&app.Deps{Cfg: cfg})
	require.NoError(t, err)
	dev, err := audit.ParseKeyring([]string{app.DevAuditKey})
	require.NoError(t, err)
	assert.Equal(t, dev.SigningKeyID(), k.SigningKeyID())

	cfg.Dev = false
	cfg.AuditKeys = []string{"c2hvcnQtc2VjcmV0LXZhbHVl"}
	_, err = app.AuditKeyring(&app.Deps{Cfg: cfg})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "COMPOSER_AUDIT_KEY")
	assert.NotContains(t, err.Error(), "c2hvcnQtc2VjcmV0LXZhbHVl")

	cfg.AuditKeys = []string{"bmV3LWtleS1uZXcta2V5LW5ldy1rZXktbmV3LWtleSE=", app.DevAuditKey}
	k, err = app.AuditKeyring(&app.Deps{Cfg: cfg})
	require.NoError(t, err)
	assert.Len(t, k.KeyIDs(), 2)
	assert.Equal(t, dev.SigningKeyID(), k.KeyIDs()[1], "the second key verifies old records")
}
