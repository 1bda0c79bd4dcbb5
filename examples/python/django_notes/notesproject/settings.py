"""Settings of the example Django app: each user's notes on the user's db
node, through shardvisor.django.

Run under the supervisor (it sets SHARDVISOR_MAP_FILE and, in reload mode,
SHARDVISOR_MAP_DELIVERY) with gunicorn:

    gunicorn --preload --workers 1 --chdir examples/python/django_notes notesproject.wsgi:application

with clients/python on PYTHONPATH (or the package installed). The notes
table comes from the cluster's schema history (shardctl schema apply
examples/notes/schema/001-notes.sql): Django does not migrate it.
"""

import os

import shardvisor.django

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "notesproject.urls"
INSTALLED_APPS = ["notes"]
MIDDLEWARE = ["shardvisor.django.UserMiddleware"]

DATABASES = {
    # Nothing of this app is stored here; Django wants a default.
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    # One alias per db node of the map: "pg1", "pg2", ...
    **shardvisor.django.databases(),
}
DATABASE_ROUTERS = ["shardvisor.django.Router"]
SHARDVISOR_SHARDED_APPS = ["notes"]
# The user of a request: the {uid} of its path (see notes/views.py).
SHARDVISOR_USER_ID = "notes.views.user_from_path"
