package stats

// Statements for the benchmark's plan dump.
const (
	QLiveCounts = qLiveCounts
	QCensusSum  = qCensusSum
	QRollupRows = qRollupRows
)
