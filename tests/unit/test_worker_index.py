"""worker_addresses entries with open ports: the index each worker gets, in registration order."""

from dataservice.dispatcher import worker_index


def test_exact_entries_are_their_workers_in_any_order():
    entries = ["a:1", "b:2", "c:3"]
    assert worker_index.resolve(entries, ["c:3", "a:1", "b:2"]) == {"c:3": 2, "a:1": 0, "b:2": 1}


def test_open_ports_are_taken_in_registration_order():
    entries = ["localhost", "localhost:%port%", "other:%port_a%", "localhost"]
    got = worker_index.resolve(entries, ["localhost:7", "other:9", "localhost:5", "localhost:6"])
    assert got == {"localhost:7": 0, "other:9": 2, "localhost:5": 1, "localhost:6": 3}


def test_an_exact_entry_is_kept_for_its_worker():
    # The worker at host:5 registers last but still gets its own entry, not the open one.
    entries = ["host:%port%", "host:5"]
    assert worker_index.resolve(entries, ["host:4", "host:5"]) == {"host:4": 0, "host:5": 1}


def test_workers_beyond_the_entries_of_their_host_get_none():
    entries = ["localhost:%port%", "other:1"]
    got = worker_index.resolve(entries, ["localhost:1", "localhost:2", "other:2", "third:1"])
    assert got == {"localhost:1": 0}


def test_a_worker_registered_again_keeps_its_index():
    entries = ["h", "h"]
    assert worker_index.resolve(entries, ["h:1", "h:2", "h:1"]) == {"h:1": 0, "h:2": 1}


def test_ipv6_hosts():
    entries = ["[::1]:%port%", "[::1]"]
    assert worker_index.resolve(entries, ["[::1]:8", "[::1]:9", "[::2]:1"]) == {"[::1]:8": 0, "[::1]:9": 1}


def test_the_refusal_names_the_list_and_what_to_do():
    message = worker_index.refusal(["h:%port%"], "x:1")
    assert "x:1" in message and "['h:%port%']" in message and "--worker_address" in message
