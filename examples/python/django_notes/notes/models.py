from django.db import models


class Note(models.Model):
    """A row of app.notes (examples/notes/schema/001-notes.sql). The table's
    primary key is (bkey, uid, id), led by the bucket key as the data
    contract asks; Django, which wants one column, knows it by id, which is
    unique per user. The table is the schema history's, not Django's."""

    bkey = models.BigIntegerField()
    uid = models.TextField()
    id = models.BigIntegerField(primary_key=True)
    body = models.TextField()
    version = models.BigIntegerField(default=1)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        managed = False
        db_table = '"app"."notes"'
