"""A FastAPI app whose requests enqueue jobs in their own SQLAlchemy transaction.

``POST /signups`` stores a signup and enqueues its welcome email in one
transaction: a request that fails after the enqueue leaves neither behind.
``GET /jobs/{id}`` shows the job. Run it with::

    pip install 'jobkeeper[postgres]' fastapi uvicorn sqlalchemy
    export EXAMPLE_DATABASE_URL=sqlite:///shop.db   # or postgresql://...
    uvicorn app:app
    jobkeeper worker --app app:jq                   # in another terminal, same variable

The jobkeeper tables and the app's tables live in the same database, which
is what lets ``connection=session`` join the request's transaction.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import create_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from jobkeeper import JobQueue

DATABASE_URL = os.environ.get("EXAMPLE_DATABASE_URL", "sqlite:///fastapi-example.db")
# The same database for both; SQLAlchemy names the psycopg 3 driver explicitly.
# pool_pre_ping: a connection the server cut (a restart, a failover) is replaced
# before a request uses it, as jobkeeper's own pool does.
engine = create_engine(
    DATABASE_URL.replace("postgresql://", "postgresql+psycopg://", 1), pool_pre_ping=True
)
jq = JobQueue(DATABASE_URL)


class Base(DeclarativeBase):
    pass


class Signup(Base):
    __tablename__ = "signups"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str]
    welcomed: Mapped[bool] = mapped_column(default=False)


@jq.task(queue="emails", max_attempts=5)
def send_welcome(signup_id: int) -> str:
    with Session(engine) as session, session.begin():
        signup = session.get_one(Signup, signup_id)
        signup.welcomed = True
        return f"welcomed {signup.email}"


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    Base.metadata.create_all(engine)
    jq.migrate()
    yield
    jq.close()
    engine.dispose()


app = FastAPI(lifespan=lifespan)


def get_session() -> Iterator[Session]:
    with Session(engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


class SignupIn(BaseModel):
    email: str
    fail_after_enqueue: bool = False


@app.post("/signups")
def create_signup(body: SignupIn, session: SessionDep) -> dict[str, int]:
    with session.begin():
        signup = Signup(email=body.email)
        session.add(signup)
        session.flush()  # assigns signup.id
        job = jq.enqueue(send_welcome, {"signup_id": signup.id}, connection=session)
        if body.fail_after_enqueue:
            # Leaving the block with an exception rolls back the signup and the job.
            raise HTTPException(status_code=409, detail="rolled back after enqueue")
    return {"signup": signup.id, "job": job.id}


@app.get("/jobs/{job_id}")
def show_job(job_id: int) -> dict[str, object]:
    job = jq.get_job(job_id)
    if job is None:
        raise HTTPException(status_code=404, detail="no such job")
    return {"status": str(job.status), "result": job.result, "attempt": job.attempt}


@app.get("/signups/{signup_id}")
def show_signup(signup_id: int, session: SessionDep) -> dict[str, object]:
    signup = session.get(Signup, signup_id)
    if signup is None:
        raise HTTPException(status_code=404, detail="no such signup")
    return {"email": signup.email, "welcomed": signup.welcomed}
