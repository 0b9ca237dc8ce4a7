"""Real agent clients, each driving a two-step tool loop (tests/e2e/test_clients.py)."""
