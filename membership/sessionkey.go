package membership

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/prefixrouter/prefixrouter/fleet"
)

// MinSessionKeyBytes is the shortest session key accepted in etcd
// (router.MinSessionKeyBytes).
const MinSessionKeyBytes = 32

// ParseSessionKey reads the value of an endpoint's session-key key: the
// key in standard base64 (surrounding white space ignored), at least
// MinSessionKeyBytes once decoded. Errors wrap fleet.ErrInvalid and never
// quote the value.
func ParseSessionKey(value []byte) ([]byte, error) {
	text := bytes.TrimSpace(value)
	k := make([]byte, base64.StdEncoding.DecodedLen(len(text)))
	n, err := base64.StdEncoding.Decode(k, text)
	if err != nil {
		return nil, fmt.Errorf("membership: %w session key: not standard base64", fleet.ErrInvalid)
	}
	if n < MinSessionKeyBytes {
		return nil, fmt.Errorf("membership: %w session key: %d bytes, want at least %d", fleet.ErrInvalid, n, MinSessionKeyBytes)
	}
	return k[:n], nil
}

// EnsureSessionKey returns the endpoint's session key, creating a random
// one when there is none: every replica that calls it gets the key the
// first one wrote (a transaction on the key's absence). Creating needs
// write access to the key (docs/security.md); reading, read access.
func EnsureSessionKey(ctx context.Context, cli *clientv3.Client, l Layout, endpoint string) ([]byte, error) {
	if err := fleet.ValidateName("endpoint", endpoint); err != nil {
		return nil, err
	}
	key := l.SessionKeyKey(endpoint)
	get, err := cli.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("membership: reading %s: %w", key, err)
	}
	if len(get.Kvs) == 0 {
		fresh := make([]byte, MinSessionKeyBytes)
		_, _ = rand.Read(fresh)
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, base64.StdEncoding.EncodeToString(fresh))).
			Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return nil, fmt.Errorf("membership: creating %s: %w", key, err)
		}
		if resp.Succeeded {
			return fresh, nil
		}
		get = (*clientv3.GetResponse)(resp.Responses[0].GetResponseRange())
	}
	if len(get.Kvs) == 0 {
		return nil, fmt.Errorf("membership: %s vanished while it was created", key)
	}
	return ParseSessionKey(get.Kvs[0].Value)
}
