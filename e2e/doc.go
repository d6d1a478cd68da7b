// Package e2e holds Composer's end-to-end tests: whole systems on real
// PostgreSQL and Redis, real worker and server processes, killed and
// frozen on purpose. It has no code of its own.
package e2e
