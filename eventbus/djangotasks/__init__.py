"""Django's task API (`django.tasks`) on the toolkit's jobs: the pieces behind
eventbus.backends.ExactlyOnceBackend. A task is a job of the type `task` (taskjob), whose
one stage calls the task's function; its TaskResult is read from the job (results); an
enqueue is keyed (keys); schedules enqueue a task once per tick (schedules)."""
