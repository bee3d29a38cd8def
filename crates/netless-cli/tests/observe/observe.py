"""Clients nobody here wrote, for tests/observe.rs: the official Prometheus text parser, the
gRPC health client (grpcio-health-checking) and the reflection client (grpcio-reflection).
Each command prints JSON, one object per line; every wait is bounded.

  observe.py metrics URL|-          samples of a scrape (or of stdin), parsed
  observe.py health TARGET NAME...  Check of each NAME: a status or an error code
  observe.py watch TARGET NAME      Watch: the first status, then (after the line
                                    `WAITING`) the next one, within 20 s
  observe.py reflection TARGET      ListServices and symbol look-ups, v1alpha and v1
"""

import json
import sys
import urllib.request

import grpc
from prometheus_client.parser import text_string_to_metric_families


def out(**fields):
    print(json.dumps(fields), flush=True)


def metrics(source):
    if source == "-":
        text = sys.stdin.read()
    else:
        with urllib.request.urlopen(source, timeout=10) as response:
            out(content_type=response.headers.get("Content-Type"))
            text = response.read().decode("utf-8")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out(family=family.name, type=family.type, name=sample.name,
                labels=sample.labels, value=sample.value)


def health(target, names):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for name in names:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
                out(service=name, status=status)
            except grpc.RpcError as e:
                out(service=name, error=e.code().name)


def watch(target, name):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stream = stub.Watch(health_pb2.HealthCheckRequest(service=name), timeout=30)
        names = health_pb2.HealthCheckResponse.ServingStatus.Name
        out(first=names(next(stream).status))
        print("WAITING", flush=True)
        out(then=names(next(stream).status))
        stream.cancel()


def reflection(target):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha import reflection_pb2
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )
    with grpc.insecure_channel(target) as channel:
        # v1alpha, through grpcio-reflection's own client.
        database = ProtoReflectionDescriptorDatabase(channel)
        out(version="v1alpha", services=sorted(database.get_services()))
        pool = DescriptorPool(database)
        for symbol in ["helloworld.Greeter", "grpc.health.v1.Health", "routeguide.RouteGuide",
                       "netless.ctl"]:
            try:
                service = pool.FindServiceByName(symbol)
                out(symbol=symbol, file=service.file.name,
                    methods=[m.name for m in service.methods],
                    services_in_file=sorted(service.file.services_by_name))
            except KeyError:
                out(symbol=symbol, error="NOT_FOUND")
        request = pool.FindMessageTypeByName("helloworld.HelloRequest")
        out(message=request.full_name, fields=[f.name for f in request.fields])
        # v1: the same messages, field for field, on the v1 method (what grpcurl asks).
        info = channel.stream_stream(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        asked = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol="helloworld.Greeter"),
            reflection_pb2.ServerReflectionRequest(
                file_containing_symbol="routeguide.RouteGuide.GetFeature"),
        ]
        answers = list(info(iter(asked), timeout=20))
        out(version="v1", services=sorted(s.name for s in answers[0].list_services_response.service))
        out(version="v1", files=len(answers[1].file_descriptor_response.file_descriptor_proto))
        out(version="v1", hidden_method_error=answers[2].error_response.error_code)


def main():
    command, args = sys.argv[1], sys.argv[2:]
    if command == "metrics":
        metrics(args[0])
    elif command == "health":
        health(args[0], args[1:])
    elif command == "watch":
        watch(args[0], args[1])
    elif command == "reflection":
        reflection(args[0])
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
