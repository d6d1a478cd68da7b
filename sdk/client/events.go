package client

import (
	"context"
	"errors"
)

// Event is an event as the API answers it: Composer's id (Id), the
// publisher's (EventId), and what it did (Runs): to each workflow a trigger
// of which matched it, STARTED with the run id or REFUSED with an error
// code and message; to each running run whose event wait or cancel_on it
// matched, RESUMED or CANCELLED with the run id.
type Event = EventFields

// PublishEvent publishes an event: the server records it, resumes the
// runs waiting for it (wait.event with a matching wait.match), cancels the
// runs whose cancel_on it matches and starts every workflow whose latest
// version has a trigger matching it, in one transaction. id is the event's dedupe key in the tenant: publishing it
// again (after a timeout, say) answers the event recorded first with
// created false and starts nothing; the same id with another name or
// payload is a CONFLICT. payload is a value encoded as a JSON object (or a
// json.RawMessage); nil means {}. Needs an API key with events:write.
func (c *Client) PublishEvent(ctx context.Context, name string, payload any, id string) (ev *Event, created bool, err error) {
	if id == "" {
		return nil, false, errors.New("composer client: an event needs an id (its dedupe key)")
	}
	p, err := jsonOf(payload)
	if err != nil {
		return nil, false, err
	}
	var res *publishEventResponse
	err = c.repeat(ctx, func() (err error) {
		res, err = publishEvent(ctx, c.gql, PublishEventInput{Name: name, Payload: p, Id: id})
		return apiError(err)
	})
	if err != nil {
		return nil, false, err
	}
	return &res.PublishEvent.Event.EventFields, res.PublishEvent.Created, nil
}

// GetEvent reads an event by Composer's id for it (Event.Id), with the
// runs it started. Needs runs:read.
func (c *Client) GetEvent(ctx context.Context, id string) (*Event, error) {
	res, err := getEvent(ctx, c.gql, id)
	if err != nil {
		return nil, apiError(err)
	}
	if res.Event == nil {
		return nil, &Error{Code: "NOT_FOUND", Message: "event not found"}
	}
	return &res.Event.EventFields, nil
}

// ListEvents reads a page of the tenant's events, newest first (only those
// named name when it is set), after the cursor after; next is the cursor of
// the following page ("" at the end). Needs runs:read.
func (c *Client) ListEvents(ctx context.Context, name string, first int, after string) (list []Event, next string, err error) {
	res, err := listEvents(ctx, c.gql, ptr(name), ptr(first), ptr(after))
	if err != nil {
		return nil, "", apiError(err)
	}
	for _, e := range res.Events.Edges {
		list = append(list, e.Node.EventFields)
	}
	if res.Events.PageInfo.HasNextPage {
		next = str(res.Events.PageInfo.EndCursor)
	}
	return list, next, nil
}
