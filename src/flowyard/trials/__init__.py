"""Trial runs: one step of a flow run alone on a sample message ("test this step")."""
