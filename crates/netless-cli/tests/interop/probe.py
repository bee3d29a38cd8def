"""Calls gRPC methods by path, with raw request bytes, through the netless gateway: a Python
grpcio client that knows no .proto, for the gateway's trust-boundary tests.

Usage: probe.py TARGET CALLS_JSON [CA_PEM [CERT_PEM KEY_PEM]]

CALLS_JSON is a list of {"path", "payload" (hex), "metadata" ([[key, value]]), "timeout"}.
Prints one JSON line per call: {"code" (a grpc.StatusCode name), "details", "reply" (hex)}.
With CA_PEM the channel is TLS (trusting CA_PEM), with CERT_PEM and KEY_PEM it presents
that client certificate.
"""

import json
import sys

import grpc

target, calls = sys.argv[1], json.loads(sys.argv[2])
files = [open(path, "rb").read() for path in sys.argv[3:6]]

if files:
    creds = grpc.ssl_channel_credentials(
        root_certificates=files[0],
        certificate_chain=files[1] if len(files) > 2 else None,
        private_key=files[2] if len(files) > 2 else None,
    )
    channel = grpc.secure_channel(target, creds)
else:
    channel = grpc.insecure_channel(target)

for call in calls:
    method = channel.unary_unary(call["path"],
                                 request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)
    try:
        reply = method(bytes.fromhex(call.get("payload", "")),
                       timeout=call.get("timeout", 10),
                       metadata=[tuple(m) for m in call.get("metadata", [])])
        out = {"code": "OK", "details": "", "reply": reply.hex()}
    except grpc.RpcError as e:
        out = {"code": e.code().name, "details": e.details() or "", "reply": ""}
    print(json.dumps(out), flush=True)
