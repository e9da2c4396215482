"""The kubelet's device-plugin API v1beta1: the vendored api.proto and the stubs made from it
(README.md here)."""
