"""A fake Mesos master speaking the v1 scheduler HTTP API, for tests (see ``fake_master``)."""
