package webhooks

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Keyring seals endpoint signing secrets at rest with AES-256-GCM. The
// first key seals; every key opens (list a new key first to rotate the
// server key, keep the old one until nothing sealed under it remains).
// The tenant, endpoint and secret ids are the additional data, so a sealed
// secret copied to another row does not open.
type Keyring struct {
	keys []sealKey
}

type sealKey struct {
	id   [4]byte
	aead cipher.AEAD
}

const sealVersion = 1

// ErrNoKeyring means the server has no COMPOSER_WEBHOOK_SECRET_KEY.
var ErrNoKeyring = errors.New("webhooks: no secret key configured (COMPOSER_WEBHOOK_SECRET_KEY)")

// ParseKeyring reads base64 keys of 32 bytes each.
func ParseKeyring(keys []string) (*Keyring, error) {
	k := &Keyring{}
	for i, s := range keys {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
		if err != nil || len(raw) != 32 {
			return nil, fmt.Errorf("webhook secret key %d: want 32 bytes, base64-encoded (openssl rand -base64 32)", i+1)
		}
		k.keys = append(k.keys, newSealKey(raw))
	}
	if len(k.keys) == 0 {
		return nil, ErrNoKeyring
	}
	return k, nil
}

func newSealKey(raw []byte) sealKey {
	block, err := aes.NewCipher(raw)
	if err != nil {
		panic(err) // 32 bytes always make an AES-256 cipher
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(raw)
	var id [4]byte
	copy(id[:], sum[:4])
	return sealKey{id: id, aead: aead}
}

func aad(tenant, endpoint, secret uuid.UUID) []byte {
	b := make([]byte, 0, 48)
	b = append(b, tenant[:]...)
	b = append(b, endpoint[:]...)
	return append(b, secret[:]...)
}

// Seal encrypts a signing key: version | key id | nonce | ciphertext.
func (k *Keyring) Seal(key []byte, tenant, endpoint, secret uuid.UUID) []byte {
	sk := k.keys[0]
	out := make([]byte, 0, 1+4+12+len(key)+16)
	out = append(out, sealVersion)
	out = append(out, sk.id[:]...)
	nonce := make([]byte, sk.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic(err)
	}
	out = append(out, nonce...)
	return sk.aead.Seal(out, nonce, key, aad(tenant, endpoint, secret))
}

// Open decrypts what Seal wrote for the same ids.
func (k *Keyring) Open(sealed []byte, tenant, endpoint, secret uuid.UUID) ([]byte, error) {
	if len(sealed) < 1+4+12+16 || sealed[0] != sealVersion {
		return nil, errors.New("webhooks: sealed secret has an unknown format")
	}
	for _, sk := range k.keys {
		if string(sk.id[:]) != string(sealed[1:5]) {
			continue
		}
		ns := sk.aead.NonceSize()
		key, err := sk.aead.Open(nil, sealed[5:5+ns], sealed[5+ns:], aad(tenant, endpoint, secret))
		if err != nil {
			return nil, errors.New("webhooks: sealed secret does not open (tampered, or moved between rows)")
		}
		return key, nil
	}
	return nil, errors.New("webhooks: sealed secret's key is not in COMPOSER_WEBHOOK_SECRET_KEY")
}
