"""The controller: the REST API, the request validator, admission, and the job runner."""
