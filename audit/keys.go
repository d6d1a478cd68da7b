package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Keyring holds the operator's keys of the audit chain
// (COMPOSER_AUDIT_KEY): each record's hash is an HMAC-SHA256 under one of
// them, named by the record's key id. The first key signs new records;
// every key verifies the records signed under it, so a key is rotated by
// listing a new one first and keeping the old one until retention has
// removed the records it signed. The keys never reach the database:
// whoever can write the audit tables but does not hold a key cannot
// rewrite the chain consistently. Safe for concurrent use.
type Keyring struct {
	keys []macKey
}

type macKey struct {
	id  string // 8 hex digits, derived from the key (not its hash)
	key []byte
}

// ErrNoKeyring means the process has no COMPOSER_AUDIT_KEY.
var ErrNoKeyring = errors.New("audit: no audit key configured (COMPOSER_AUDIT_KEY)")

// KeySize is the length of an audit key, before its base64 encoding.
const KeySize = 32

// ParseKeyring reads base64 keys of KeySize bytes each, the signing key
// first.
func ParseKeyring(keys []string) (*Keyring, error) {
	k := &Keyring{}
	seen := map[string]bool{}
	for i, s := range keys {
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(s))
		if err != nil || len(raw) != KeySize {
			return nil, fmt.Errorf("audit key %d: want %d bytes, base64-encoded (openssl rand -base64 32)", i+1, KeySize)
		}
		mk := macKey{id: keyID(raw), key: raw}
		if seen[mk.id] {
			return nil, fmt.Errorf("audit key %d: listed twice", i+1)
		}
		seen[mk.id] = true
		k.keys = append(k.keys, mk)
	}
	if len(k.keys) == 0 {
		return nil, ErrNoKeyring
	}
	return k, nil
}

// keyID names a key by a MAC of a fixed string under it: stable, short,
// and no help in guessing the key.
func keyID(raw []byte) string {
	m := hmac.New(sha256.New, raw)
	m.Write([]byte("composer/audit/key-id"))
	return hex.EncodeToString(m.Sum(nil)[:4])
}

// SigningKeyID is the id of the key new records are signed under.
func (k *Keyring) SigningKeyID() string { return k.keys[0].id }

// KeyIDs lists the ids of every key, the signing key's first.
func (k *Keyring) KeyIDs() []string {
	out := make([]string, len(k.keys))
	for i, mk := range k.keys {
		out[i] = mk.id
	}
	return out
}

func (k *Keyring) byID(id string) ([]byte, bool) {
	for _, mk := range k.keys {
		if mk.id == id {
			return mk.key, true
		}
	}
	return nil, false
}

// The MACs' domains: a record's, the head's and the retention mark's MAC
// can never stand in for one another.
const (
	domainRecord = "composer/audit/record/v2"
	domainHead   = "composer/audit/head/v2"
	domainPruned = "composer/audit/pruned/v2"
)

// mac is HMAC-SHA256 under key id of the domain, the tenant, seq and the
// parts, each part length-prefixed.
func (k *Keyring) mac(id, domain string, tenant uuid.UUID, seq int64, parts ...[]byte) ([]byte, bool) {
	key, ok := k.byID(id)
	if !ok {
		return nil, false
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(domain))
	m.Write(tenant[:])
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(seq))
	m.Write(n[:])
	for _, p := range parts {
		binary.BigEndian.PutUint32(n[:4], uint32(len(p)))
		m.Write(n[:4])
		m.Write(p)
	}
	return m.Sum(nil), true
}

// recordMAC is a keyed record's hash: its tenant, seq, time in
// microseconds, the previous record's hash and its fields (Body).
func (k *Keyring) recordMAC(id string, tenant uuid.UUID, prev []byte, r Record) ([]byte, bool) {
	var at [8]byte
	binary.BigEndian.PutUint64(at[:], uint64(r.At.UnixMicro()))
	return k.mac(id, domainRecord, tenant, r.Seq, at[:], prev, Body(r))
}

// headMAC vouches for a chain head: its seq and the hash of its last
// record. A head moved back (the newest records deleted) needs a MAC the
// server wrote for that older head.
func (k *Keyring) headMAC(id string, tenant uuid.UUID, seq int64, hash []byte) ([]byte, bool) {
	return k.mac(id, domainHead, tenant, seq, hash)
}

// prunedMAC vouches for retention's cut: records up to seq were deleted on
// purpose, and the record at seq had hash.
func (k *Keyring) prunedMAC(id string, tenant uuid.UUID, seq int64, hash []byte) ([]byte, bool) {
	return k.mac(id, domainPruned, tenant, seq, hash)
}
