package client

import "context"

// RateLimit is one of the tenant's named step rate limits: a step whose
// definition names it ("rate_limit": {"name": "partner-api", "key":
// "input.partner_id"}) takes a token of its key's bucket — PerSecond a
// second, Burst at once — before it runs, and waits for one (on the same
// attempt, never failed for it) when none is due.
type RateLimit = RateLimitFields

// RateLimitSpec declares or changes a rate limit.
type RateLimitSpec struct {
	// Name: lowercase letters, digits, '_' and '-', starting with a letter
	// (at most 64).
	Name        string
	PerSecond   float64
	Burst       int
	Description string
}

func (s RateLimitSpec) input() RateLimitInput {
	return RateLimitInput{Name: s.Name, PerSecond: s.PerSecond, Burst: s.Burst, Description: ptr(s.Description)}
}

// CreateRateLimit declares a rate limit (at most the plan's
// maxRateLimits; a name taken is CONFLICT).
func (c *Client) CreateRateLimit(ctx context.Context, s RateLimitSpec) (*RateLimit, error) {
	res, err := createRateLimit(ctx, c.gql, s.input())
	if err != nil {
		return nil, apiError(err)
	}
	return &res.CreateRateLimit.RateLimitFields, nil
}

// UpdateRateLimit changes a rate limit's rate, burst and description
// (applied within seconds).
func (c *Client) UpdateRateLimit(ctx context.Context, s RateLimitSpec) (*RateLimit, error) {
	res, err := updateRateLimit(ctx, c.gql, s.input())
	if err != nil {
		return nil, apiError(err)
	}
	return &res.UpdateRateLimit.RateLimitFields, nil
}

// DeleteRateLimit removes a rate limit; steps that still name it run
// without one.
func (c *Client) DeleteRateLimit(ctx context.Context, name string) error {
	if _, err := deleteRateLimit(ctx, c.gql, name); err != nil {
		return apiError(err)
	}
	return nil
}

// RateLimits lists the tenant's rate limits by name.
func (c *Client) RateLimits(ctx context.Context) ([]RateLimit, error) {
	res, err := rateLimits(ctx, c.gql)
	if err != nil {
		return nil, apiError(err)
	}
	out := make([]RateLimit, len(res.RateLimits))
	for i, r := range res.RateLimits {
		out[i] = r.RateLimitFields
	}
	return out, nil
}

// GetRateLimit reads one rate limit; nil when there is none of that name.
func (c *Client) GetRateLimit(ctx context.Context, name string) (*RateLimit, error) {
	res, err := rateLimit(ctx, c.gql, name)
	if err != nil {
		return nil, apiError(err)
	}
	if res.RateLimit == nil {
		return nil, nil
	}
	return &res.RateLimit.RateLimitFields, nil
}
