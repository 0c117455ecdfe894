"""The engine core's half of disaggregated serving (`EngineCore` mixes it in).

Prefill role: a finished prefill's prompt blocks are pinned (`_export`) until the decode
side pulls them (`release_export`) or they expire. Decode role: a request whose prompt KV
lives on a prefill worker gets its blocks allocated first (`begin_import`) and is
scheduled once the bytes have arrived (`end_import`).
"""

from __future__ import annotations

from stator.engines.native.kv_handoff import ExportTable, ImportPlan, import_plan
from stator.engines.native.request import Sequence
from stator.protocols import DisaggParams, EngineOutput, EngineRequest


class DisaggCore:
    exports: ExportTable
    importing: dict[str, ImportPlan]
    transfer_info: dict
    worker_id: int

    def begin_import(self, request: EngineRequest) -> ImportPlan | None:
        """A decode request whose prompt KV is pinned on a prefill worker: allocate its
        blocks (taking what the prefix cache holds) and return which remote blocks to pull
        into which local ones. None: it was queued to prefill here instead (no room now,
        or nothing to pull)."""
        seq = self._new_sequence(request)
        disagg = request.disagg
        assert disagg is not None
        num_remote = min(disagg.num_prompt_tokens, seq.num_tokens - 1)
        usable = (
            disagg.block_size == self.config.block_size
            and num_remote > 0
            and not seq.wants_prompt_logprobs
            and self.blocks.admit(seq, seq.num_tokens)
        )
        self.seqs[seq.request_id] = seq
        if not usable:
            self.scheduler.add(seq)
            return None
        plan = import_plan(seq, disagg.remote_block_ids, num_remote, self.config.block_size)
        plan.num_tokens = num_remote
        self.importing[seq.request_id] = plan
        return plan

    def end_import(self, request_id: str, ok: bool) -> None:
        """The pull of `begin_import`'s plan is over: schedule the sequence with its prompt
        computed, or (`ok` False) to compute it here."""
        plan = self.importing.pop(request_id)
        seq = plan.seq
        assert seq is not None
        if plan.aborted:  # `abort` came while the bytes were moving
            self.blocks.free(seq)
            return
        if ok:
            seq.num_computed_tokens = plan.num_tokens
            self.blocks.commit(seq)
        else:
            self.blocks.free(seq)
            seq.num_computed_tokens = 0
            seq.num_cached_tokens = None
        self.scheduler.add(seq)

    def pinned(self, pin_id: str) -> list[int] | None:
        export = self.exports.get(pin_id)
        return None if export is None else export.block_ids

    def claim_export(self, pin_id: str) -> None:
        self.exports.claim(pin_id)

    def release_export(
        self, pin_id: str, unless_claimed: bool = False, later: bool = False
    ) -> bool:
        seq = self.exports.release(pin_id, unless_claimed, later)
        if seq is None:
            return False
        self.blocks.free(seq)
        return True

    def expire_exports(self) -> int:
        expired = self.exports.expire()
        for seq in expired:
            self.blocks.free(seq)
        return len(expired)

    def _export(self, seq: Sequence, out: EngineOutput) -> None:
        """Pin a finished prefill's prompt blocks and say where they are."""
        if self.exports.get(seq.request_id) is not None:
            self.release_export(seq.request_id)
        export = self.exports.pin(
            seq.request_id, seq, seq.num_prompt_tokens, self.config.block_size
        )
        out.disagg = DisaggParams(
            prefill_worker_id=self.worker_id,
            remote_block_ids=export.block_ids,
            num_prompt_tokens=seq.num_prompt_tokens,
            transfer=self.transfer_info,
            prefill_request_id=export.pin_id,
            block_size=self.config.block_size,
            expires_in=self.exports.timeout,
        )
        if self.exports.released_early(export.pin_id):
            # The router's caller left before this answer and its release came first:
            # nobody will pull these blocks. The answer still names the pin (a decode side
            # that asks finds nothing pinned and prefills itself).
            self.release_export(export.pin_id)
