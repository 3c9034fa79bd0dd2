"""Settings of the app."""

MAX_RETRIES = 3
TIMEOUT_SECONDS = 10
