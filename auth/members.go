package auth

import (
	"context"
	"errors"
	"fmt"
	"net/mail"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/composer-dev/composer/internal/errs"
	"github.com/composer-dev/composer/internal/pg"
)

// Member is a subject's membership in a tenant.
type Member struct {
	Subject   string
	Role      Role
	Email     string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Members manages a tenant's memberships inside its transaction. Every
// change bumps the tenant's membership version (a database trigger), which
// is what makes every Authorizer reload the tenant's roles. The zero value
// is ready to use.
type Members struct{}

func checkSubject(subject string) error {
	if subject == "" || len(subject) > 255 || !utf8.ValidString(subject) || strings.IndexFunc(subject, unprintable) >= 0 {
		return errs.E(errs.Invalid, "subject must be 1-255 printable characters (no control or bidirectional formatting characters)")
	}
	return nil
}

// unprintable are characters a name shown to people must not hold:
// controls, and the bidirectional and invisible formatting characters that
// make text read other than it is (Unicode's Cf category: U+202E, U+2066,
// U+200B …).
func unprintable(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

func checkRole(r Role) error {
	if !r.Valid() {
		return errs.E(errs.Invalid, "unknown role %q (owner, admin, developer or viewer)", r)
	}
	return nil
}

// Add makes subject a member of the transaction's tenant.
func (Members) Add(ctx context.Context, tx *pg.Tx, subject string, role Role, email string) (Member, error) {
	if err := checkSubject(subject); err != nil {
		return Member{}, err
	}
	if err := checkRole(role); err != nil {
		return Member{}, err
	}
	if email != "" {
		if a, err := mail.ParseAddress(email); err != nil || a.Address != email || len(email) > 320 {
			return Member{}, errs.E(errs.Invalid, "email %q is not a valid address", email)
		}
	}
	m := Member{Subject: subject, Role: role, Email: email}
	err := tx.QueryRow(ctx, qMemberInsert, tx.Tenant, subject, role, email).Scan(&m.CreatedAt, &m.UpdatedAt)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "23505" {
		return Member{}, errs.E(errs.Conflict, "%s is already a member", subject)
	}
	if err != nil {
		return Member{}, fmt.Errorf("add member %s: %w", subject, err)
	}
	return m, nil
}

// Get returns subject's membership, or NotFound.
func (Members) Get(ctx context.Context, tx *pg.Tx, subject string) (Member, error) {
	m, err := scanMember(tx.QueryRow(ctx, qMemberGet, tx.Tenant, subject))
	if errors.Is(err, pgx.ErrNoRows) {
		return Member{}, errs.E(errs.NotFound, "member %s not found", subject)
	}
	if err != nil {
		return Member{}, fmt.Errorf("get member %s: %w", subject, err)
	}
	return m, nil
}

// List returns the tenant's members by subject.
func (Members) List(ctx context.Context, tx *pg.Tx) ([]Member, error) {
	rows, err := tx.Query(ctx, qMemberList, tx.Tenant)
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	ms, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Member, error) { return scanMember(r) })
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	return ms, nil
}

// ChangeRole sets subject's role. Demoting the last owner is a Conflict:
// a tenant always keeps someone who can manage it.
func (ms Members) ChangeRole(ctx context.Context, tx *pg.Tx, subject string, role Role) (Member, error) {
	if err := checkRole(role); err != nil {
		return Member{}, err
	}
	if role != RoleOwner {
		if err := ms.keepAnOwner(ctx, tx, subject, "demote"); err != nil {
			return Member{}, err
		}
	}
	m, err := scanMember(tx.QueryRow(ctx, qMemberSetRole, tx.Tenant, subject, role))
	if errors.Is(err, pgx.ErrNoRows) {
		return Member{}, errs.E(errs.NotFound, "member %s not found", subject)
	}
	if err != nil {
		return Member{}, fmt.Errorf("change role of %s: %w", subject, err)
	}
	return m, nil
}

// Remove ends subject's membership. Removing the last owner is a Conflict.
func (ms Members) Remove(ctx context.Context, tx *pg.Tx, subject string) error {
	if err := ms.keepAnOwner(ctx, tx, subject, "remove"); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, qMemberDelete, tx.Tenant, subject)
	if err != nil {
		return fmt.Errorf("remove member %s: %w", subject, err)
	}
	if tag.RowsAffected() == 0 {
		return errs.E(errs.NotFound, "member %s not found", subject)
	}
	return nil
}

// keepAnOwner fails when subject is the only owner. It locks the owner
// rows, so concurrent demotions of two different owners cannot both see
// the other one still there.
func (Members) keepAnOwner(ctx context.Context, tx *pg.Tx, subject, verb string) error {
	rows, err := tx.Query(ctx, qOwnersLock, tx.Tenant)
	if err != nil {
		return fmt.Errorf("lock owners: %w", err)
	}
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("lock owners: %w", err)
	}
	if len(owners) == 1 && owners[0] == subject {
		return errs.E(errs.Conflict, "cannot %s the last owner; make another member owner first", verb)
	}
	return nil
}

func scanMember(row pgx.Row) (Member, error) {
	var m Member
	var role string
	err := row.Scan(&m.Subject, &role, &m.Email, &m.CreatedAt, &m.UpdatedAt)
	m.Role = Role(role)
	return m, err
}
