"""GET and POST /v1/users/{uid}/notes: the user's notes, on the user's node.

A POST is retried through a move's write pause by shardvisor.django.run;
its id is chosen by the client's Idempotency-Key (or at random), so a
resend after an unknown outcome makes no second note.
"""

import hashlib
import json
import os
import secrets

from django.db import connections
from django.http import HttpResponseNotAllowed, JsonResponse

import shardvisor.django
from notes.models import Note


def user_from_path(request):
    """SHARDVISOR_USER_ID: the {uid} of /v1/users/{uid}/..."""
    parts = request.path.split("/")
    return parts[3] if len(parts) > 3 and parts[1:3] == ["v1", "users"] and parts[3] else None


def _node_headers(resp, uid):
    r = shardvisor.django.map_router()
    resp["X-Shardvisor-Node"] = r.node_for(uid)
    resp["X-Shardvisor-Map-Version"] = str(r.map_version)
    resp["X-Pid"] = str(os.getpid())
    return resp


def healthz(request):
    return JsonResponse({"ok": True, "map_version": shardvisor.django.map_router().map_version, "pid": os.getpid()})


def notes(request, uid):
    router = shardvisor.django.map_router()
    if request.method == "GET":
        rows = [{"id": n.id, "body": n.body} for n in Note.objects.filter(uid=uid).order_by("id")]
        return _node_headers(JsonResponse(rows, safe=False), uid)
    if request.method != "POST":
        return HttpResponseNotAllowed(["GET", "POST"])
    body = json.loads(request.body or b"{}").get("body", "")
    key = request.headers.get("Idempotency-Key") or secrets.token_hex(16)
    nid = int.from_bytes(hashlib.sha256(f"{uid}\0{key}".encode()).digest()[:7], "big")

    def create():
        n, _ = Note.objects.get_or_create(bkey=router.key(uid), uid=uid, id=nid, defaults={"body": body})
        return n

    n = shardvisor.django.run(uid, create, idempotent=True)  # get_or_create by a client-chosen id: safe to repeat
    return _node_headers(JsonResponse({"id": n.id, "body": n.body}, status=201), uid)
