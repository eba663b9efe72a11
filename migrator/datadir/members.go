package datadir

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/kubefence/kubefence/migrator/v2v3"
)

// Peer is a cluster member as the data dir records it.
type Peer struct {
	ID       uint64   `json:"id"`
	Name     string   `json:"name"`
	PeerURLs []string `json:"peerURLs"`
}

// Membership is who a data dir belongs to.
type Membership struct {
	Self      Peer   `json:"self"`
	Peers     []Peer `json:"peers"`
	ClusterID uint64 `json:"clusterId"`
	// CommitIndex is the committed raft index the WAL records.
	CommitIndex uint64 `json:"commitIndex"`
	// Term is the raft term the WAL records.
	Term uint64 `json:"term"`
}

// InitialCluster is the data dir's cluster as etcd's --initial-cluster (for a restore).
func (m Membership) InitialCluster() string { return InitialCluster(m.Peers) }

// InitialCluster is etcd's --initial-cluster for peers: NAME=PEER-URL,... with one entry per
// peer URL.
func InitialCluster(peers []Peer) string {
	var parts []string
	for _, p := range peers {
		for _, u := range p.PeerURLs {
			parts = append(parts, p.Name+"="+u)
		}
	}
	return strings.Join(parts, ",")
}

// as is membership m as the member whose own membership is own is built with it: m's peers,
// with the name and peer URLs m records for that member as Self. The member is found by its
// ID; one a rebuild swapped in already (of another cluster: etcd's restore gave it new IDs,
// from this membership) by its name.
func (m Membership) as(own Membership) (Membership, error) {
	i := slices.IndexFunc(m.Peers, func(p Peer) bool { return p.ID == own.Self.ID })
	if i < 0 && own.ClusterID != m.ClusterID {
		i = slices.IndexFunc(m.Peers, func(p Peer) bool { return p.Name == own.Self.Name })
	}
	if i < 0 {
		return m, fmt.Errorf("member %s (%x) is not among the voting members the most advanced member (%s) records (removed from the cluster since?)", own.Self.Name, own.Self.ID, m.Self.Name)
	}
	m.Self = m.Peers[i]
	return m, nil
}

// ReadMembership reads the member's id from its WAL and the cluster's members from its backend
// (etcd 3.4 and later keep them in the "members" bucket).
func ReadMembership(dataDir, walDir string) (Membership, error) {
	var m Membership
	src, err := v2v3.ReadSource(dataDir, walDir)
	if err != nil {
		return m, err
	}
	m.Self.ID, m.ClusterID, m.CommitIndex, m.Term = src.NodeID, src.ClusterID, src.HardState.Commit, src.HardState.Term
	src.Close()
	path := filepath.Join(dataDir, "member", "snap", "db")
	db, err := bolt.Open(path, 0o400, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		return m, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("members"))
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			id, err := strconv.ParseUint(string(k), 16, 64)
			if err != nil {
				return fmt.Errorf("members bucket: key %q: %w", k, err)
			}
			var rec struct {
				Name     string   `json:"name"`
				PeerURLs []string `json:"peerURLs"`
				Learner  bool     `json:"isLearner"`
			}
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("members bucket: member %x: %w", id, err)
			}
			if !rec.Learner {
				m.Peers = append(m.Peers, Peer{ID: id, Name: rec.Name, PeerURLs: rec.PeerURLs})
			}
			return nil
		})
	})
	if err != nil {
		return m, err
	}
	sort.Slice(m.Peers, func(i, j int) bool { return m.Peers[i].ID < m.Peers[j].ID })
	for _, p := range m.Peers {
		if p.ID == m.Self.ID {
			m.Self = p
		}
	}
	if m.Self.Name == "" || len(m.Self.PeerURLs) == 0 {
		return m, fmt.Errorf("%s: member %x (from the WAL) is not among the members its backend records, or has no name", dataDir, m.Self.ID)
	}
	return m, nil
}
