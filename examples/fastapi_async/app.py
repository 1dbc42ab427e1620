"""A fully async FastAPI app: enqueue inside the request's ``AsyncSession``
transaction, then wait for the job's result without blocking the event loop.

``POST /reports`` stores a report request and enqueues the job that builds
it, in one transaction (``connection=session``): a request that fails after
the enqueue leaves neither behind. ``GET /reports/{job_id}`` waits up to
``?timeout=`` seconds for the job's result (``wait_async``). PostgreSQL only:
SQLAlchemy's async SQLite driver (aiosqlite) runs its connection on a thread
of its own, which an enqueue cannot join. Run it with::

    pip install 'jobkeeper[postgres]' fastapi uvicorn 'sqlalchemy[asyncio]'
    createdb jobkeeper_example                 # or set EXAMPLE_DATABASE_URL to yours
    uvicorn app:app
    jobkeeper worker --app app:jq              # in another terminal
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from jobkeeper import ConfigError, JobCancelled, JobFailed, JobNotFound, JobQueue

# A database of its own by default: its tables are no other app's business.
DATABASE_URL = os.environ.get(
    "EXAMPLE_DATABASE_URL", "postgresql://postgres@127.0.0.1/jobkeeper_example"
)
# SQLAlchemy runs the psycopg 3 driver async under create_async_engine.
# pool_pre_ping: a connection the server cut (a restart, a failover) is replaced
# before a request uses it, as jobkeeper's own pool does.
engine = create_async_engine(
    DATABASE_URL.replace("postgresql://", "postgresql+psycopg://", 1), pool_pre_ping=True
)
sessions = async_sessionmaker(engine, expire_on_commit=False)
jq = JobQueue(DATABASE_URL)


class Base(DeclarativeBase):
    pass


class ReportRequest(Base):
    __tablename__ = "report_requests"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str]


@jq.task(queue="reports")
async def build_report(request_id: int, customer: str) -> dict[str, object]:
    return {"request": request_id, "customer": customer, "lines": len(customer)}


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    jq.migrate()
    yield
    await jq.aclose()
    await engine.dispose()


app = FastAPI(lifespan=lifespan)


async def get_session() -> AsyncIterator[AsyncSession]:
    async with sessions() as session:
        yield session


SessionDep = Annotated[AsyncSession, Depends(get_session)]


class ReportIn(BaseModel):
    customer: str
    fail_after_enqueue: bool = False


@app.post("/reports")
async def request_report(body: ReportIn, session: SessionDep) -> dict[str, int]:
    async with session.begin():
        request = ReportRequest(customer=body.customer)
        session.add(request)
        await session.flush()  # assigns request.id
        job = await jq.enqueue_async(
            build_report, {"request_id": request.id, "customer": body.customer}, connection=session
        )
        if body.fail_after_enqueue:
            # Leaving the block with an exception rolls back the request and the job.
            raise HTTPException(status_code=409, detail="rolled back after enqueue")
    return {"request": request.id, "job": job.id}


@app.get("/reports/{job_id}")
async def report_result(job_id: int, timeout: float = 5.0) -> dict[str, object]:
    try:
        result = await jq.wait_async(job_id, timeout=timeout)
    except ConfigError as exc:  # a job id or timeout wait_async refuses (0, -1, nan)
        raise HTTPException(status_code=422, detail=str(exc)) from None
    except TimeoutError:
        raise HTTPException(status_code=202, detail="not ready yet") from None
    except JobNotFound:  # never enqueued, or pruned after its retention
        raise HTTPException(status_code=404, detail=f"no report job {job_id}") from None
    except (JobFailed, JobCancelled) as exc:
        raise HTTPException(status_code=500, detail=str(exc)) from None
    return {"report": result}
