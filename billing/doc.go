// Package billing meters usage from committed transitions (rows written in
// the same transaction as the transition they measure), aggregates it,
// prices it against plans and exports it.
package billing
