package imds

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Simulator is a small IMDSv2 server for `spotguard drill`: it hands out session tokens, answers
// the instance identity, and announces a spot interruption when told to. Everything else is 404.
// It is not a test double of the real service's every detail: AWS's ec2-metadata-mock is what the
// tests use.
type Simulator struct {
	srv  *http.Server
	ln   net.Listener
	done chan struct{} // closed when Serve has returned

	mu     sync.Mutex
	tokens map[string]time.Time
	action string    // "" until Interrupt
	at     time.Time // the notice's time
}

// StartSimulator listens on addr (e.g. "127.0.0.1:0") and serves until Close.
func StartSimulator(addr string) (*Simulator, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Simulator{ln: ln, tokens: map[string]time.Time{}, done: make(chan struct{})}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(s.done)
		s.srv.Serve(ln)
	}()
	return s, nil
}

// Endpoint is the simulator's base URL, for imds.endpoint.
func (s *Simulator) Endpoint() string { return "http://" + s.ln.Addr().String() }

// Interrupt announces a spot interruption with action (terminate, stop or hibernate) that takes
// effect in after (two minutes on EC2).
func (s *Simulator) Interrupt(action string, after time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.action, s.at = action, time.Now().Add(after).UTC().Truncate(time.Second)
}

// Close stops the server and waits for it.
func (s *Simulator) Close() error {
	err := s.srv.Close()
	<-s.done
	return err
}

func (s *Simulator) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/latest/api/token" {
		if r.Method != http.MethodPut || r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds") == "" {
			http.Error(w, "bad token request", http.StatusBadRequest)
			return
		}
		b := make([]byte, 16)
		rand.Read(b)
		tok := hex.EncodeToString(b)
		s.mu.Lock()
		s.tokens[tok] = time.Now()
		s.mu.Unlock()
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		w.Write([]byte(tok))
		return
	}
	s.mu.Lock()
	_, ok := s.tokens[r.Header.Get("X-aws-ec2-metadata-token")]
	action, at := s.action, s.at
	s.mu.Unlock()
	if !ok {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	switch strings.TrimPrefix(r.URL.Path, "/latest/meta-data/") {
	case "instance-id":
		w.Write([]byte("i-0d1e2a3d4b5e6e7f8"))
	case "instance-type":
		w.Write([]byte("drill.local"))
	case "placement/availability-zone":
		w.Write([]byte("local-1a"))
	case SourceSpot.Path():
		if action == "" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(map[string]string{"action": action, "time": at.Format(time.RFC3339)})
	default:
		http.NotFound(w, r)
	}
}
