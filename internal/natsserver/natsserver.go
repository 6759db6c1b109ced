package natsserver

import (
	"net"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/nats-io/nats-server/v2/server"
)

// Server is an embedded NATS server.
type Server struct {
	*server.Server
	dir  string
	port int
}

// Start runs a server on 127.0.0.1 with JetStream storing in dir. port 0
// picks a free port; Restart keeps it.
func Start(dir string, port int) (*Server, error) {
	if port == 0 {
		port = server.RANDOM_PORT
	}
	s := &Server{dir: dir, port: port}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: s.port, JetStream: true, StoreDir: s.dir,
		NoLog: true, NoSigs: true,
	})
	if err != nil {
		return errors.Wrap(err, "natsserver: new")
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return errors.New("natsserver: not ready within 10s")
	}
	s.Server = ns
	if a, ok := ns.Addr().(*net.TCPAddr); ok {
		s.port = a.Port
	}
	return nil
}

// Restart shuts the server down and starts it again on the same port and
// store directory (JetStream recovers its streams from there).
func (s *Server) Restart() error {
	s.Shutdown()
	s.WaitForShutdown()
	return s.start()
}

// Up starts the server again after Stop, on the same port and store
// directory.
func (s *Server) Up() error { return s.start() }

// Stop shuts the server down.
func (s *Server) Stop() {
	s.Shutdown()
	s.WaitForShutdown()
}
