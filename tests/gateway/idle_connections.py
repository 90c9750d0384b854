#!/usr/bin/python3
"""Opens N TCP connections to 127.0.0.1:PORT and holds them idle, as a process of its own (the
gateway test's "10k idle connections"): every PARTIAL-th sends the start of a request header and
nothing more, the others send nothing. Then it waits up to WAIT seconds for the server to close
them, and says how it went.

Usage: idle_connections.py PORT N PARTIAL WAIT
Prints "open N in MS ms" once all are connected, then "closed C of N, 408 answers A, last at S s"
(S: seconds after the last one opened). Exit 0; 77 when the descriptor limit cannot hold N
(the line names the limit); 1 when a connect fails."""
import resource
import select
import socket
import sys
import time


def main() -> int:
    port, n, partial, wait = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = n + 64
    if hard != resource.RLIM_INFINITY and hard < need:
        print(f"skip: RLIMIT_NOFILE hard limit {hard} < {need} (ulimit -Hn)", flush=True)
        return 77
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    start = time.monotonic()
    socks = {}
    for i in range(n):
        s = socket.socket()
        s.settimeout(30)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as e:
            print(f"connect {i} failed: {e}", flush=True)
            return 1
        if partial and i % partial == 0:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        s.setblocking(False)
        socks[s.fileno()] = s
    opened = time.monotonic()
    print(f"open {n} in {(opened - start) * 1000:.0f} ms", flush=True)
    ep = select.epoll()
    for fd in socks:
        ep.register(fd, select.EPOLLIN | select.EPOLLRDHUP)
    closed, answers, last = 0, 0, 0.0
    deadline = opened + wait
    while socks and time.monotonic() < deadline:
        for fd, _ in ep.poll(min(1.0, max(0.0, deadline - time.monotonic()))):
            s = socks[fd]
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                answers += data.startswith(b"HTTP/1.1 408")
                continue
            ep.unregister(fd)
            s.close()
            del socks[fd]
            closed += 1
            last = time.monotonic() - opened
    print(f"closed {closed} of {n}, 408 answers {answers}, last at {last:.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
