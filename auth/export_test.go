package auth

// FormatAPIKey builds a key with a valid checksum from any key id and
// secret, so tests can present a well-formed key with a wrong secret.
var FormatAPIKey = formatAPIKey
