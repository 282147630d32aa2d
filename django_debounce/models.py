"""Tables of django-debounce: per-key state (``DebounceKey``) and run history (``DebounceRun``)."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.utils.translation import gettext_lazy as _

from django_debounce.dbtime import AwareDateTimeField


def _delete_in_batches(qs: models.QuerySet, batch_size: int, dry_run: bool) -> int:
    """Delete the rows of ``qs`` in batches of primary keys; returns how many (would) go."""
    if dry_run:
        return qs.count()
    deleted = 0
    while True:
        pks = list(qs.values_list("pk", flat=True)[:batch_size])
        if not pks:
            return deleted
        _total, per_model = qs.model._default_manager.using(qs.db).filter(pk__in=pks).delete()
        deleted += per_model.get(qs.model._meta.label, 0)


class DebounceKeyQuerySet(models.QuerySet):
    """Query logic for keys."""

    def active(self) -> DebounceKeyQuerySet:
        """Keys with pending triggers or a live run."""
        return self.exclude(state=DebounceKey.State.IDLE)

    def delete_stale(
        self, cutoff: datetime, *, batch_size: int = 1000, dry_run: bool = False
    ) -> int:
        """Delete idle keys (nothing pending, nothing running) whose last state change is older
        than ``cutoff`` (an aware datetime) and their run history (by cascade) in batches;
        returns the count of keys (that would be) deleted."""
        stale = self.filter(
            state=DebounceKey.State.IDLE,
            pending=0,
            running_until__isnull=True,
            updated_at__lt=cutoff,
        )
        return _delete_in_batches(stale, batch_size, dry_run)


class DebounceRunQuerySet(models.QuerySet):
    """Query logic for run history."""

    def delete_expired(
        self, cutoff: datetime, *, batch_size: int = 1000, dry_run: bool = False
    ) -> int:
        """Delete finished runs that started before ``cutoff``, in batches; returns the count."""
        qs = self.filter(started_at__lt=cutoff).exclude(outcome=DebounceRun.Outcome.RUNNING)
        return _delete_in_batches(qs, batch_size, dry_run)

    def unfinished(self, cutoff: datetime) -> DebounceRunQuerySet:
        """Runs still marked running that started before ``cutoff`` while their key has no
        live run: their finish was never recorded (the store failed at that moment, or lost
        its state), and no lease of theirs is left to recover them."""
        return self.filter(
            outcome=DebounceRun.Outcome.RUNNING,
            started_at__lt=cutoff,
            debounce_key__running_until__isnull=True,
        )

    def close_unfinished(self, cutoff: datetime, now: datetime, *, dry_run: bool = False) -> int:
        """Record ``unfinished(cutoff)`` runs as lost ("finish never recorded"), so the
        history shows no run as live forever and they are purged like finished runs;
        returns the count."""
        qs = self.unfinished(cutoff)
        if dry_run:
            return qs.count()
        return qs.update(
            outcome=DebounceRun.Outcome.LOST, finished_at=now, error="finish never recorded"
        )


class DebounceKey(models.Model):
    """One row per key: the state machine of docs/design.md ("State machine") for that key."""

    class State(models.TextChoices):
        IDLE = "idle", _("idle")
        PENDING = "pending", _("pending")
        RUNNING = "running", _("running")

    key = models.TextField(_("key"), help_text=_("Readable key the triggers were grouped by."))
    key_hash = models.CharField(
        _("key hash"),
        max_length=64,
        help_text=_("SHA-256 of task name and key; the identity used by the stores."),
    )
    task_name = models.CharField(
        _("task"), max_length=255, help_text=_("Celery name of the debounced task.")
    )
    state = models.CharField(
        _("state"),
        max_length=16,
        choices=State.choices,
        default=State.IDLE,
        help_text=_(
            "idle: nothing to do; pending: triggers wait for a run; running: a run is live."
        ),
    )
    pending = models.PositiveIntegerField(
        _("pending"),
        default=0,
        help_text=_("Triggers in the open flight, not yet claimed by a run."),
    )
    flight_id = models.PositiveBigIntegerField(
        _("flight id"), default=0, help_text=_("+1 each time a flight opens; a fencing token.")
    )
    first_trigger_at = AwareDateTimeField(
        _("first trigger"), null=True, blank=True, help_text=_("First trigger of the open flight.")
    )
    last_trigger_at = AwareDateTimeField(
        _("last trigger"), null=True, blank=True, help_text=_("Last trigger of the open flight.")
    )
    due_at = AwareDateTimeField(
        _("due at"),
        null=True,
        blank=True,
        help_text=_("When the open flight may run: min(last trigger + wait, anchor + max_wait)."),
    )
    anchor_at = AwareDateTimeField(
        _("max_wait anchor"),
        null=True,
        blank=True,
        help_text=_(
            "What the open flight's max_wait counts from, as lodash's maxWait: the last run's "
            "start when the trigger that opened the flight continued the stream (within wait "
            "of the key's last trigger and within max_wait of that start), else the flight's "
            "first trigger."
        ),
    )
    bound_at = AwareDateTimeField(
        _("max_wait bound"),
        null=True,
        blank=True,
        help_text=_(
            "The open flight runs no later than this: the smallest anchor + max_wait among its "
            "triggers (a trigger may give its own max_wait)."
        ),
    )
    payload = models.JSONField(
        _("payload"), null=True, blank=True, help_text=_("Payload of the last trigger (JSON).")
    )
    scheduled_seq = models.PositiveBigIntegerField(
        _("dispatch sequence"),
        default=0,
        help_text=_("Sequence number of the only dispatch message that may act."),
    )
    scheduled = models.BooleanField(
        _("dispatch outstanding"),
        default=False,
        help_text=_("A dispatch message for the open flight has been published."),
    )
    scheduled_at = AwareDateTimeField(
        _("dispatch due"),
        null=True,
        blank=True,
        help_text=_("When the outstanding dispatch message should arrive."),
    )
    overlap = models.BooleanField(
        _("overlap"), default=False, help_text=_("The task allows overlapping runs of this key.")
    )
    due_fixed = models.BooleanField(
        _("due time fixed"),
        default=False,
        help_text=_(
            "The open flight runs as soon as it may (a leading edge, or a full collected "
            "batch); later triggers join it without delaying it."
        ),
    )
    attempt = models.PositiveIntegerField(
        _("attempt"),
        default=0,
        help_text=_("Retries already made for the triggers of the open flight (0: first try)."),
    )
    attempted = models.PositiveIntegerField(
        _("attempted triggers"),
        default=0,
        db_default=0,
        help_text=_(
            "Triggers of the open flight (collect: items) that a failed or lost run already "
            "covered: when its attempts run out, only these are given up."
        ),
    )
    not_before = AwareDateTimeField(
        _("retry not before"),
        null=True,
        blank=True,
        help_text=_("End of the retry backoff: the open flight does not run before it."),
    )
    run_id = models.PositiveBigIntegerField(
        _("run id"), default=0, help_text=_("+1 at every claim; only the current run may finish.")
    )
    run_attempt = models.PositiveIntegerField(
        _("attempt of live run"), default=0, help_text=_("Retries made before the live run.")
    )
    run_seq = models.PositiveBigIntegerField(
        _("message of live run"),
        default=0,
        # a database default too: during a rolling deploy, the previous release creates rows
        # without this column (it does not know it)
        db_default=0,
        help_text=_(
            "Sequence of the dispatch message that claimed the live run (0: claimed in "
            "process): the lease keeper extends the lease of the run its message claimed."
        ),
    )
    run_anchor_at = AwareDateTimeField(
        _("max_wait anchor of live run"),
        null=True,
        blank=True,
        help_text=_("The max_wait anchor of the flight the live run claimed."),
    )
    run_bound_at = AwareDateTimeField(
        _("max_wait bound of live run"),
        null=True,
        blank=True,
        help_text=_("The max_wait bound of the flight the live run claimed."),
    )
    run_attempted = models.PositiveIntegerField(
        _("attempted triggers of live run"),
        default=0,
        db_default=0,
        help_text=_("Triggers claimed by the live run that an earlier attempt covered."),
    )
    running_until = AwareDateTimeField(
        _("lease until"),
        null=True,
        blank=True,
        help_text=_("Lease of the live run; past it the run counts as lost."),
    )
    run_triggers = models.PositiveIntegerField(
        _("triggers in live run"), default=0, help_text=_("Triggers claimed by the live run.")
    )
    run_payload = models.JSONField(
        _("payload of live run"),
        null=True,
        blank=True,
        help_text=_("Payload claimed by the live run, kept to redo it if it is lost."),
    )
    run_first_trigger_at = AwareDateTimeField(
        _("first trigger of live run"),
        null=True,
        blank=True,
        help_text=_("First trigger claimed by the live run."),
    )
    run_last_trigger_at = AwareDateTimeField(
        _("last trigger of live run"),
        null=True,
        blank=True,
        help_text=_("Last trigger claimed by the live run."),
    )
    run_due_at = AwareDateTimeField(
        _("due time of live run"),
        null=True,
        blank=True,
        help_text=_("When the flight the live run claimed was due."),
    )
    run_flight_id = models.PositiveBigIntegerField(
        _("flight of live run"),
        default=0,
        db_default=0,
        help_text=_("The flight the live run claimed."),
    )
    run_started = models.BooleanField(
        _("live run started"),
        default=True,
        db_default=True,
        help_text=_(
            "False while the live run was claimed by a flush and its message has not started "
            "it yet."
        ),
    )
    triggers = models.PositiveBigIntegerField(
        _("triggers"), default=0, help_text=_("Triggers counted, in total.")
    )
    runs = models.PositiveBigIntegerField(
        _("runs"),
        default=0,
        help_text=_(
            "Runs that covered their triggers, in total (attempts that failed and were "
            "retried, or were lost, are not counted; the run history lists every attempt)."
        ),
    )
    merged = models.PositiveBigIntegerField(
        _("merged"),
        default=0,
        help_text=_("Triggers absorbed without a run of their own, in total."),
    )
    cancelled = models.PositiveBigIntegerField(
        _("cancelled"),
        default=0,
        help_text=_(
            "Triggers dropped without a run, in total: by cancel, or inside the window of a "
            "leading run when trailing=False."
        ),
    )
    last_run_at = AwareDateTimeField(
        _("last run"), null=True, blank=True, help_text=_("When the last run started.")
    )
    last_outcome = models.CharField(
        _("last outcome"),
        max_length=16,
        blank=True,
        default="",
        help_text=_("Outcome of the last finished run."),
    )
    counter_id = models.PositiveBigIntegerField(
        _("counter id"),
        default=0,
        help_text=_(
            "The Redis store's counter of the open flight (0: none): the only counter a claim "
            "folds into this row."
        ),
    )
    counter_until = AwareDateTimeField(
        _("counter until"),
        null=True,
        blank=True,
        help_text=_(
            "Until when a Redis counter may count triggers of the open flight; a claim that "
            "cannot reach Redis waits for it (empty: no counter)."
        ),
    )
    created_at = AwareDateTimeField(
        _("created"), auto_now_add=True, help_text=_("First trigger ever.")
    )
    updated_at = AwareDateTimeField(_("updated"), auto_now=True, help_text=_("Last state change."))

    objects = DebounceKeyQuerySet.as_manager()

    class Meta:
        verbose_name = _("debounce key")
        verbose_name_plural = _("debounce keys")
        # Every index is written by every update that changes an indexed column, so there are
        # few: a step that leaves ``state`` alone (a merge, a take) changes none of them and
        # PostgreSQL can update the row in place (HOT). The key hash's unique index is a
        # constraint, not ``unique=True``, which adds a second (``LIKE``) index on PostgreSQL.
        constraints = [models.UniqueConstraint(fields=["key_hash"], name="debounce_key_hash_uniq")]
        indexes = [
            models.Index(fields=["state"], name="debounce_key_state"),
            models.Index(fields=["task_name", "state"], name="debounce_key_task_state"),
            models.Index(fields=["updated_at"], name="debounce_key_updated"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} {self.key}"


class DebounceDue(models.Model):
    """The database store's due index: one row per key that needs attention, at ``due_at``
    (the open flight's due time; when its dispatch message counts as lost; a live run's
    lease end). A narrow table of its own, so a merged trigger's update of the key row
    changes no indexed column (PostgreSQL updates it in place)."""

    key_hash = models.CharField(
        _("key hash"),
        max_length=64,
        primary_key=True,
        help_text=_("The key (DebounceKey.key_hash)."),
    )
    task_name = models.CharField(
        _("task"), max_length=255, help_text=_("Celery name of the debounced task.")
    )
    due_at = AwareDateTimeField(_("due at"), help_text=_("When the key next needs attention."))

    class Meta:
        verbose_name = _("due index entry")
        verbose_name_plural = _("due index entries")
        indexes = [
            models.Index(fields=["task_name", "due_at"], name="debounce_due_task_due"),
            # the pump's first entry and due entries of several tasks, in due order
            models.Index(fields=["due_at"], name="debounce_due_at"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} {self.key_hash[:12]} at {self.due_at}"


class DebounceRun(models.Model):
    """One row per run: which flight it absorbed, how late it started, how it ended."""

    class Outcome(models.TextChoices):
        RUNNING = "running", _("running")
        SUCCESS = "success", _("success")
        FAILURE = "failure", _("failure")
        LOST = "lost", _("lost")
        RETRY = "retry", _("failed, retried")

    debounce_key = models.ForeignKey(
        DebounceKey,
        on_delete=models.CASCADE,
        related_name="run_history",
        db_index=False,  # debounce_run_key_run_uniq and debounce_run_key_started lead with it
        verbose_name=_("key"),
        help_text=_("The key this run belongs to."),
    )
    task_name = models.CharField(_("task"), max_length=255, help_text=_("Celery name of the task."))
    flight_id = models.PositiveBigIntegerField(
        _("flight id"), help_text=_("Flight this run absorbed.")
    )
    run_id = models.PositiveBigIntegerField(_("run id"), help_text=_("Per-key run counter."))
    attempt = models.PositiveIntegerField(
        _("attempt"), default=0, help_text=_("Retries made before this run (0: first try).")
    )
    triggers = models.PositiveIntegerField(
        _("triggers"), help_text=_("Triggers claimed by this run (merged = triggers - 1).")
    )
    first_trigger_at = AwareDateTimeField(_("first trigger"), help_text=_("First claimed trigger."))
    last_trigger_at = AwareDateTimeField(_("last trigger"), help_text=_("Last claimed trigger."))
    due_at = AwareDateTimeField(_("due at"), help_text=_("When the flight became due."))
    started_at = AwareDateTimeField(_("started"), help_text=_("When the run was claimed."))
    delay = models.FloatField(
        _("delay"), help_text=_("Seconds from the last claimed trigger to the start of the run.")
    )
    finished_at = AwareDateTimeField(
        _("finished"), null=True, blank=True, help_text=_("When it ended.")
    )
    outcome = models.CharField(
        _("outcome"),
        max_length=16,
        choices=Outcome.choices,
        default=Outcome.RUNNING,
        help_text=_(
            "running, success, failure (after the last retry), retry (failed; its triggers "
            "went back to pending for a retry), or lost (lease ran out)."
        ),
    )
    error = models.TextField(
        _("error"), blank=True, default="", help_text=_("Error text of a failure.")
    )

    objects = DebounceRunQuerySet.as_manager()

    class Meta:
        verbose_name = _("debounce run")
        verbose_name_plural = _("debounce runs")
        constraints = [
            models.UniqueConstraint(
                fields=["debounce_key", "run_id"], name="debounce_run_key_run_uniq"
            ),
        ]
        indexes = [
            # Two covering indexes for the admin summary (runs of a period grouped by task,
            # answered from an index alone): a short period is a range of the first, a long one
            # a full scan of the second, already in task order. The first also serves the
            # purge of old runs, the second the runs list filtered by task.
            models.Index(
                fields=["started_at", "task_name", "outcome", "delay", "triggers"],
                name="debounce_run_summary",
            ),
            models.Index(
                fields=["task_name", "started_at", "outcome", "delay", "triggers"],
                name="debounce_run_task_summary",
            ),
            # The recent runs on a key's admin page.
            models.Index(fields=["debounce_key", "started_at"], name="debounce_run_key_started"),
        ]

    def __str__(self) -> str:
        return f"{self.task_name} run {self.run_id} ({self.outcome})"

    @property
    def merged(self) -> int:
        """Triggers this run absorbed beyond its own: ``triggers - 1``."""
        return max(self.triggers - 1, 0)
