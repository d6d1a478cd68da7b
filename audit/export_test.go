package audit

import "github.com/google/uuid"

// RecordMAC exposes a record's MAC to the tests that play an attacker
// holding some other key.
func RecordMAC(k *Keyring, id string, tenant uuid.UUID, prev []byte, r Record) []byte {
	mac, _ := k.recordMAC(id, tenant, prev, r)
	return mac
}
