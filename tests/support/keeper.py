"""A process that keeps its state only in memory, for tests that suspend a sandbox with CRIU
(issue 29): a random token and a counter it increments every 50 ms; it answers
``"<token> <counter> <pid>"`` on a loopback port it writes to the file ``port`` in its working
directory. Restored from a checkpoint it answers with the same token and a counter that went on
from where it stopped. ``KEEPER`` is its program, without a single quote (a shell may quote it);
``ASK`` a program that prints its answer (run in the same directory)."""

from __future__ import annotations

KEEPER = r"""
import os, secrets, socket, threading, time
token, counter = secrets.token_hex(8), [0]
def count():
    while True:
        counter[0] += 1
        time.sleep(0.05)
threading.Thread(target=count, daemon=True).start()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: rebound at restore
server.bind(("127.0.0.1", 0))
server.listen()
with open("port.partial", "w") as f:
    f.write(str(server.getsockname()[1]))
os.rename("port.partial", "port")
while True:
    conn, _ = server.accept()
    conn.sendall(f"{token} {counter[0]} {os.getpid()}".encode())
    conn.close()
"""
assert "'" not in KEEPER

ASK = (
    "import socket; s = socket.create_connection(('127.0.0.1', int(open('port').read())), timeout=5); "
    "print(s.recv(100).decode())"
)
