package stats

import (
	"math"
	"time"
)

// DurationBuckets is the length of a duration histogram. Bucket 0 counts
// durations under 1 ms; bucket i (1 ≤ i < 127) counts [2^((i-1)/4),
// 2^(i/4)) ms, a quarter of an octave; bucket 127 counts everything from
// 2^(126/4) ms (about 36 days) up. The SQL function
// composer_duration_bucket assigns them; this file only reads them back.
const DurationBuckets = 128

// MaxRelativeError bounds the error of a percentile read from a histogram
// for durations from 1 ms to 36 days: the estimate is the geometric middle
// of the bucket holding the true (nearest-rank) percentile, so it is
// within a factor 2^(1/8) of it, 9.05%. Under 1 ms the estimate is 0.5 ms.
var MaxRelativeError = math.Pow(2, 1.0/8) - 1

// histogram counts durations by bucket.
type histogram [DurationBuckets]int64

func (h *histogram) addArray(a []int32) {
	for i := 0; i < len(a) && i < DurationBuckets; i++ {
		h[i] += int64(a[i])
	}
}

// quantile estimates the q-quantile (0 < q ≤ 1) in milliseconds by
// nearest rank; ok is false for an empty histogram.
func (h *histogram) quantile(q float64) (ms float64, ok bool) {
	var n int64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0, false
	}
	rank := int64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	var cum int64
	for i, c := range h {
		cum += c
		if cum >= rank {
			return bucketValue(i), true
		}
	}
	return bucketValue(DurationBuckets - 1), true
}

// bucketValue is the value a duration bucket stands for.
func bucketValue(i int) float64 {
	switch {
	case i <= 0:
		return 0.5
	case i >= DurationBuckets-1:
		return math.Pow(2, float64(DurationBuckets-2)/4)
	default:
		return math.Pow(2, (float64(i)-0.5)/4)
	}
}

// BucketOf is the histogram bucket of a duration, as the database assigns
// it (for tests and documentation).
func BucketOf(d time.Duration) int {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 1 {
		return 0
	}
	return min(DurationBuckets-1, 1+int(math.Floor(4*math.Log(ms)/math.Ln2)))
}

// BucketValue is the duration, in milliseconds, that bucket i stands for.
func BucketValue(i int) float64 { return bucketValue(i) }
