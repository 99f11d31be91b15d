"""A warm device's side of its SuperNode's runtime API, at a few milliseconds of CPU a task.

Flower's ``RuntimeHttpClient`` sends each request through httpx, and ``flwr-clientapp`` pulls
and pushes a message's objects from thread pools started per task. A task is 16-20 small
requests on loopback (the task's input, one per object of the message, one per object of the
reply, the outcome). Profiled in a warm process on ml-100k, that path cost about 1.5 ms of CPU
per request, most of a training message's. Here the requests go over kept-alive stdlib HTTP
connections, and the objects are pulled and pushed one after another in the task's thread. Flower's
paths, protobuf messages, headers, retry policy and object handling are kept as they are. Only
the transport of one request and the thread pools are replaced.
"""

from __future__ import annotations

import http.client
import selectors
import socket
import ssl
import threading
import time

from .wire import flwr

RETRY = (0.02, 0.05)  # an object still on its way to the SuperNode: first and longest wait
# (objects can reach the SuperNode tens of ms after it hands out the task; each ask costs CPU)
PROTOBUF = "application/protobuf"


def _readable(sock) -> bool:
    """Whether an idle kept-alive socket has something to read (its end of stream: the server
    closed it). A selector, not ``select.select``: a descriptor above 1023 is fine."""
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        return bool(sel.select(0))


class KeptAlive:
    """Kept-alive HTTP(S) connections to ``host:port``, one per request in flight. A socket
    the server closed while idle (it has something to read, its end of stream) is replaced."""

    def __init__(self, host: str, port: int, context: ssl.SSLContext | None = None):
        self.host, self.port, self.context = host, port, context
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def _take(self) -> http.client.HTTPConnection:
        with self._lock:
            while self._idle:
                conn = self._idle.pop()
                if conn.sock is not None and not _readable(conn.sock):
                    return conn
                conn.close()
        if self.context is None:
            return http.client.HTTPConnection(self.host, self.port)
        return http.client.HTTPSConnection(self.host, self.port, context=self.context)

    def post(self, path: str, body: bytes, headers: dict, timeout: float | None):
        """(status, headers, body) of one POST. Transport failures are raised as the httpx
        errors Flower's retry policy knows: connect, write and read errors and timeouts."""
        import httpx

        conn, stage = self._take(), "connect"
        try:
            conn.timeout = timeout
            if conn.sock is None:
                conn.connect()
            conn.sock.settimeout(timeout)
            stage = "write"
            conn.request("POST", path, body=body, headers=headers)
            stage = "read"
            resp = conn.getresponse()
            content = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            timed_out = isinstance(e, socket.timeout)
            error = {"connect": httpx.ConnectTimeout if timed_out else httpx.ConnectError,
                     "write": httpx.WriteTimeout if timed_out else httpx.WriteError,
                     "read": httpx.ReadTimeout if timed_out else httpx.ReadError}[stage]
            raise error(f"{path}: {type(e).__name__}: {e}") from e
        if resp.will_close:
            conn.close()
        else:
            with self._lock:
                self._idle.append(conn)
        return resp.status, resp.getheaders(), content

    def close(self):
        with self._lock:
            for conn in self._idle:
                conn.close()
            self._idle.clear()


class TaskToken:
    """The token of the task at hand, sent with every request of the tasks' client."""

    def __init__(self):
        self.value, self.requests = "", 0  # requests: how many this task's client sent

    def header(self) -> str:
        if not self.value:
            raise RuntimeError("no task at hand: a task request without its token")
        self.requests += 1
        return self.value


def client_class():
    """``TaskClient``: Flower's runtime API client whose unary requests go over ``KeptAlive``
    (built on first use: ``fedcf.flower`` loads Flower lazily)."""
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = _make_client_class()
    return _CLIENT


_CLIENT = None


def _make_client_class():
    flwr()
    import httpx
    from flwr.supercore.constant import TASK_TOKEN_HEADER, VERSION_INCOMPATIBILITY_MESSAGE_METADATA_KEY
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.protobuf.client import ProtobufRequestContext
    from flwr.supercore.runtime import RuntimeHttpClient
    from flwr.supercore.runtime_version_compatibility import RuntimeVersionMetadata
    from google.protobuf.message import DecodeError

    VERSION_NOTE = VERSION_INCOMPATIBILITY_MESSAGE_METADATA_KEY.lower()

    class TaskClient(RuntimeHttpClient):
        def setup(self, sender: KeptAlive, component: str, token: TaskToken | None):
            self.sender, self.token = sender, token
            self.version = RuntimeVersionHttpInterceptor(component_name=component)
            self.headers = {"content-type": PROTOBUF, "accept": PROTOBUF,
                            "accept-encoding": "identity", **dict(
                                RuntimeVersionMetadata.from_local_component(component)
                                .as_metadata())}
            return self

        def _unary_unary(self, *, path, rpc_method, request, response_type, timeout=None):
            path = path if path.startswith("/") else f"/{path}"
            body = request.SerializeToString(deterministic=True)
            seconds = self._client.timeout.read if timeout is None else timeout

            def send():
                headers = self.headers if self.token is None else {
                    **self.headers, TASK_TOKEN_HEADER: self.token.header()}
                status, got, content = self.sender.post(path, body, headers, seconds)
                if status >= 400 or any(k.lower() == VERSION_NOTE for k, _ in got):
                    # rare: Flower's own handling of errors and version messages
                    req = httpx.Request("POST", f"{self._base_url}{path}")
                    resp = httpx.Response(status, headers=got, content=content, request=req)
                    ctx = ProtobufRequestContext(rpc_method=rpc_method, message=request,
                                                 request=req)
                    self.version.intercept(ctx, lambda _: resp).raise_for_status()
                return content

            content = (self._retry_invoker.invoke(send) if self._retry_invoker is not None
                       else send())
            result = response_type()
            try:
                result.ParseFromString(content)
            except DecodeError as e:
                raise ValueError("Invalid protobuf response payload") from e
            return result

        def close(self):
            self.sender.close()
            super().close()

    return TaskClient


def runtime_client(address: str, *, insecure: bool, certificates: bytes | None,
                   token: TaskToken | None = None):
    """A client of the SuperNode's runtime API at ``address``: the executor's own (no
    ``token``) or the tasks' (sending ``token``'s value)."""
    from flwr.supercore.retry import make_simple_http_retry_invoker

    host, _, port = address.rpartition(":")
    context = None
    if not insecure and not isinstance(certificates, bytes):
        raise ValueError("a TLS runtime API needs certificates (the CA's PEM bytes); pass "
                         "insecure=True for a plain-HTTP one on loopback")
    if not insecure:
        context = ssl.create_default_context(cadata=certificates.decode("ascii"))
    client = client_class().from_server_address(
        server_address=address, insecure=insecure, root_certificates=certificates,
        interceptors=[], retry_invoker=make_simple_http_retry_invoker())
    return client.setup(KeptAlive(host, int(port), context),
                        "flwr-clientapp" if token else "SuperExec", token)


def pull_tree(tree, pull, confirm, kind):
    """The object ``tree`` describes, its objects pulled one after another (one not yet at
    the SuperNode asked for again after milliseconds), confirmed, inflated, of type ``kind``."""
    from flwr.supercore.constant import PULL_MAX_TIME, PULL_MAX_TRIES_PER_OBJECT
    from flwr.supercore.inflatable.inflatable_object import iterate_object_tree
    from flwr.supercore.inflatable.inflatable_utils import (
        ObjectPullError,
        ObjectUnavailableError,
        inflate_object_from_contents,
    )

    contents, start = {}, time.monotonic()
    for node in iterate_object_tree(tree):
        wait = RETRY[0]
        for tries in range(1, PULL_MAX_TRIES_PER_OBJECT + 1):
            try:
                contents[node.object_id] = pull(node.object_id)
                break
            except ObjectUnavailableError:
                if tries == PULL_MAX_TRIES_PER_OBJECT or time.monotonic() - start > PULL_MAX_TIME:
                    raise ObjectPullError(node.object_id,
                                          "timeout or retry limit reached") from None
                time.sleep(wait)
                wait = min(2 * wait, RETRY[1])
    confirm(tree.object_id)
    obj = inflate_object_from_contents(tree.object_id, contents, keep_object_contents=False)
    if not isinstance(obj, kind):
        raise TypeError(f"expected a {kind.__name__} from the SuperNode, got "
                        f"{type(obj).__name__}")
    return obj


def set_message_id(message, object_id: str):
    """A message's id, as ``flwr-clientapp`` sets it (Flower's Metadata has no setter)."""
    message.metadata.__dict__["_message_id"] = object_id


def pull_task_input(client):
    """The task's message, context, run and app, as ``flwr-clientapp`` pulls them."""
    from flwr.app import Message
    from flwr.common.serde import context_from_proto, fab_from_proto, run_from_proto
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest  # pylint: disable=E0611
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.task_identity import TaskIdentity

    res = client.PullTaskInput(PullTaskInputRequest())
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = (  # as Flower sets them
        res.task_id, res.run.run_id, res.context.node_id)
    context, run, fab = (context_from_proto(res.context), run_from_proto(res.run),
                         fab_from_proto(res.fab))
    pulled = client.PullMessages(PullAppMessagesRequest())
    if not pulled.messages_list:
        raise RuntimeError("the SuperNode handed out a task without a message")
    node, tree = Node(node_id=context.node_id), pulled.message_object_trees[0]
    message = pull_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node,
                                                  context.run_id), Message)
    set_message_id(message, tree.object_id)
    return message, context, run, fab


def push_message(client, message, context):
    """Push the reply ``message`` (head, then the objects the SuperNode asks for, in turn)."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.proto.node_pb2 import Node  # pylint: disable=E0611
    from flwr.proto.runtime_pb2 import PushAppMessagesRequest  # pylint: disable=E0611
    from flwr.supercore.inflatable.inflatable_object import (
        get_all_nested_objects,
        get_object_tree,
        no_object_id_recompute,
    )
    from flwr.supercore.inflatable.inflatable_protobuf_utils import make_push_object_fn_protobuf

    set_message_id(message, message.object_id)
    head = message_to_proto(remove_content_from_message(message))
    with no_object_id_recompute():
        res = client.PushMessages(PushAppMessagesRequest(
            messages_list=[head], message_object_trees=[get_object_tree(message)]))
        push = make_push_object_fn_protobuf(client.PushObject, Node(node_id=context.node_id),
                                            run_id=context.run_id, session_id=res.session_id)
        wanted = set(res.objects_to_push)
        for object_id, obj in get_all_nested_objects(message).items():
            if object_id in wanted:
                push(object_id, obj.deflate())


def push_task_output(client, context, status, details):
    """The task's outcome and its context, as ``flwr-clientapp`` pushes them."""
    flwr()
    from flwr.supernode.runtime.run_clientapp import push_task_output as push

    push(client, context, status, details)
