"""One module per P4 file of p4src/include/, one class per P4 control named after it (control
JobAdmission in job_admission.p4 -> JobAdmissionTables in job_admission.py), owning exactly that
control's tables. Counters are not tables: controller/counters.py reads those PassingIngress
declares (p4src/passing.p4)."""
