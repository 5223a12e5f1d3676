"""The fleet's client side: what a user or program publishes to, asks of and reads from the topics."""
