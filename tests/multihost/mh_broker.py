#!/usr/bin/env python3
"""Runs commands inside emulated hosts on behalf of nsrsh (tests/multihost).

A process inside one host cannot enter another host's PID namespace (only
the parent namespace can), so nsrsh connects to this broker, which runs
outside every host. Usage: mh_broker.py STATE_DIR  (serves STATE_DIR/broker.sock
until SIGTERM).

Protocol, one request per connection: the client sends one JSON line
{"host", "command", "cwd", "env"} together with its stdin, stdout and stderr
(SCM_RIGHTS); the broker runs `sh -c command` inside the host with those
descriptors and answers one line, the exit code. If the client goes away
first (mpirun ended it), the command's process group is ended by PID.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading

state = sys.argv[1]
sock_path = os.path.join(state, "broker.sock")


def holder_of(host):
    """The holder PID of a host named by hostname or address, or None."""
    for entry in sorted(os.listdir(state)):
        d = os.path.join(state, entry)
        try:
            with open(os.path.join(d, "addr")) as f:
                addr = f.read().strip()
            with open(os.path.join(d, "holder")) as f:
                pid = f.read().strip()
        except OSError:
            continue
        if host in (entry, addr):
            return pid
    return None


def serve(conn):
    fds = []
    try:
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        buf = msg
        while not buf.endswith(b"\n"):
            more = conn.recv(1 << 20)
            if not more:
                return
            buf += more
        req = json.loads(buf)
        pid = holder_of(req["host"])
        if pid is None or len(fds) != 3:
            os.write(fds[2] if len(fds) == 3 else 2,
                     f"nsrsh: no emulated host '{req['host']}'\n".encode())
            conn.sendall(b"255\n")
            return
        cwd = req.get("cwd") or "/"
        proc = subprocess.Popen(
            ["nsenter", "-t", pid, "--net", "--uts", "--ipc", "--mount", "--pid",
             "--wd=" + cwd, "--", "/bin/sh", "-c", req["command"]],
            stdin=fds[0], stdout=fds[1], stderr=fds[2], env=req["env"],
            start_new_session=True)
        for fd in fds:
            os.close(fd)
        fds = []

        # Client gone (EOF) before the command ended: end the command.
        def watch():
            try:
                while conn.recv(1024):
                    pass
            except OSError:
                pass
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except OSError:
                    pass
        threading.Thread(target=watch, daemon=True).start()
        rc = proc.wait()
        if rc < 0:
            rc = 128 - rc
        try:
            conn.sendall(f"{rc}\n".encode())
        except OSError:
            pass
    except Exception as e:  # one bad request must not end the broker
        print(f"mh_broker: {e!r}", file=sys.stderr)
    finally:
        for fd in fds:
            os.close(fd)
        conn.close()


def main():
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path + ".new")
    os.rename(sock_path + ".new", sock_path)
    srv.listen(64)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


main()
