"""Where the session→sandbox mapping, leases and de-duplication live. ``base`` has the protocol."""
